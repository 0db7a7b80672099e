"""The framework examples against a real AM and node daemon: `examples/train_accelerate.py` and
`examples/train_lightning.py` train, save a checkpoint mid-epoch, stop, and a new process resumes
from the checkpoint with exactly the rows not trained on at it, in every epoch. And a batch that
Accelerate's loader, one item ahead, hands the loop keeps its rows while the loop uses it."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from conftest import ROOT, WATCHDOG_S, run_python

EPOCHS = 2
SAVE_AT = 5


def run_example(job, example: str, *arguments: str) -> list:
    """Runs `examples/EXAMPLE` as the job's trainer; returns the JSON lines it printed."""
    trainer = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / example), *arguments],
        env=job.trainer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    job.processes.append(trainer)
    stdout, stderr = trainer.communicate(timeout=WATCHDOG_S)
    assert trainer.returncode == 0, f"{example} failed: {stderr[-4000:]}"
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def trained_ids(path: pathlib.Path, up_to_step=None) -> list:
    """The (epoch, ids) of each step an example wrote with --ids-out, up to a step."""
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    return [(step["epoch"], step["ids"]) for step in steps if up_to_step is None or step["step"] <= up_to_step]


def assert_every_row_of_every_epoch_once(job, steps: list) -> None:
    for epoch in range(EPOCHS):
        rows = [row for seen, ids in steps if seen == epoch for row in ids]
        assert sorted(rows) == list(range(job.rows)), f"every row of epoch {epoch} exactly once across the resume"


def train_stop_and_resume(job, example: str, checkpoint: pathlib.Path, out: pathlib.Path) -> None:
    """Runs `example` until two steps past its checkpoint at SAVE_AT, then again in a new process
    from that checkpoint to the end; checks that the steps trained up to the checkpoint and after
    the resume hold every row of every epoch once."""
    common = ["--checkpoint-dir", str(checkpoint), "--save-every", str(SAVE_AT), "--epochs", str(EPOCHS)]
    first = run_example(job, example, *common, "--max-steps", str(SAVE_AT + 2), "--ids-out", str(out / "first.jsonl"))
    assert [line["checkpoint_step"] for line in first if "checkpoint_step" in line] == [SAVE_AT]
    second = run_example(job, example, *common, "--ids-out", str(out / "second.jsonl"))
    assert second[0] == {"resumed_at_step": SAVE_AT}
    steps = trained_ids(out / "first.jsonl", up_to_step=SAVE_AT) + trained_ids(out / "second.jsonl")
    assert_every_row_of_every_epoch_once(job, steps)


def test_the_accelerate_example_resumes_from_save_state_with_every_row_once(make_job, tmp_path):
    job = make_job("accelerate", rows=3000, task_rows=500, epochs=EPOCHS)
    job.start()
    train_stop_and_resume(job, "train_accelerate.py", tmp_path / "checkpoint", tmp_path)


# Accelerate's loader over a dataset that notes each item's ids as it yields it; the loop works a
# while on each batch, during which the daemon writes into the ring, then compares the batch's ids
# with those noted. The ring holds a few batches, so it is full and the daemon writes into a
# released batch's room at once.
OVERWRITES = r"""
import json, sys, time
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from sluice.torch import Dataset

keep_batches, epochs = int(sys.argv[1]), int(sys.argv[2])


class Noting(Dataset):
    def __iter__(self):
        for item in super().__iter__():
            noted.append(item["id"].clone())
            yield item


noted = []
accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True, dispatch_batches=False))
loader = accelerator.prepare(torch.utils.data.DataLoader(Noting(keep_batches=keep_batches), batch_size=None))
steps, changed, ids = 0, 0, []
for epoch in range(epochs):
    for item in loader:
        time.sleep(0.02)
        changed += not torch.equal(item["id"], noted[steps])
        ids.append(item["id"].tolist())
        steps += 1
print(json.dumps({"steps": steps, "changed": changed, "ids": ids}))
"""


@pytest.mark.parametrize("keep_batches", [1, 2])
def test_a_batch_accelerate_hands_the_loop_keeps_its_rows_only_with_keep_batches_2(make_job, keep_batches):
    """With `keep_batches=1` the batch in use was released when Accelerate fetched the next one,
    and the daemon writes over it: the check sees it. With 2 it holds, across epochs too."""
    job = make_job("overwrites", rows=3000, task_rows=1500, epochs=EPOCHS, ring_size=128 << 10)
    job.start()
    trainer = run_python(OVERWRITES, job.trainer_env(), str(keep_batches), str(EPOCHS))
    job.processes.append(trainer)
    stdout, stderr = trainer.communicate(timeout=WATCHDOG_S)
    assert trainer.returncode == 0, stderr[-4000:]
    seen = json.loads(stdout.splitlines()[-1])
    assert seen["steps"] == EPOCHS * job.rows // 250
    if keep_batches == 1:
        assert seen["changed"] > 0, "the daemon wrote over batches released while the loop used them"
    else:
        assert seen["changed"] == 0, f"{seen['changed']} of {seen['steps']} batches changed while the loop used them"
        rows = sorted(row for ids in seen["ids"] for row in ids)
        assert rows == sorted(list(range(job.rows)) * EPOCHS), "the loop saw every row of every epoch once"


def test_the_lightning_example_resumes_from_its_checkpoint_with_every_row_once(make_job, tmp_path):
    job = make_job("lightning", rows=3000, task_rows=500, epochs=EPOCHS)
    job.start()
    checkpoint = tmp_path / "checkpoints"
    train_stop_and_resume(job, "train_lightning.py", checkpoint, tmp_path)
    assert f"step={SAVE_AT}.ckpt" in [path.name for path in checkpoint.iterdir()]
