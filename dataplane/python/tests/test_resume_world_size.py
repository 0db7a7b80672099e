"""A data checkpoint taken by four trainers, resumed by three and by six, on the live job (`sluice
scale`) and by a new run (`sluice run --resume-from TOKEN` with another `roles[].num`): every new
rank loads the state of rank `rank % 4` (a new rank has none of its own), and the rows not consumed
at the checkpoint reach the new ranks exactly once."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

import pytest

from conftest import WATCHDOG_S, generate, wait_until

SAVED_WORLD_SIZE = 4
CHECKPOINT_STEP = 6

# Started with the saved world size, the trainer reads CHECKPOINT_STEP batches, commits their
# checkpoint, saves its state with the ids it read, and waits to be stopped. Started with another,
# it loads the state of rank `rank % 4`, reads to the end of the job, and writes the ids it read.
TRAINER = r"""
import json, os, sys, time
import sluice

out, saved_world_size, checkpoint_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank, world_size = int(os.environ["SLUICE_RANK"]), int(os.environ["SLUICE_WORLD_SIZE"])


def write_atomically(path, value):
    temporary = path + ".tmp"
    with open(temporary, "w") as file:
        json.dump(value, file)
    os.replace(temporary, path)


reader = sluice.Reader()
if world_size == saved_world_size:
    ids = []
    for batch in reader:
        ids.extend(batch.column("id").to_pylist())
        if reader.step == checkpoint_step:
            state = reader.state_dict()
            write_atomically(os.path.join(out, f"saved-{rank}.json"), {"state": state, "ids": ids})
            break
    while True:
        time.sleep(1)
with open(os.path.join(out, f"saved-{rank % saved_world_size}.json")) as file:
    saved = json.load(file)
reader.load_state_dict(saved["state"])
after = []
for batch in reader:
    after.extend(batch.column("id").to_pylist())
    time.sleep(0.01)
write_atomically(os.path.join(out, f"resumed-{rank}-of-{world_size}.json"), {"step": reader.step, "ids": after})
"""


def read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_spec(path: pathlib.Path, tmp_path: pathlib.Path, data: pathlib.Path, trainer: pathlib.Path, out: pathlib.Path, num: int, nodes: int = 1) -> None:
    path.write_text(
        f"""
name: world-size-{os.getpid()}
data:
  sources: [{{ uri: "file://{data}", format: parquet }}]
  task_rows: 500
  batch_size: 250
  shuffle: {{ seed: 7 }}
nodes: {nodes}
roles:
  - {{ name: worker, num: {num}, command: ["{sys.executable}", "{trainer}", "{out}", "{SAVED_WORLD_SIZE}", "{CHECKPOINT_STEP}"] }}
failover: {{ restart: on-failure, heartbeat_interval_ms: 50, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{tmp_path / 'ckpt'}" }}
"""
    )


class Run:
    """`sluice run` of a spec, its output drained; `address` is where its AM serves."""

    def __init__(self, sluice_bin: pathlib.Path, tmp_path: pathlib.Path, spec: pathlib.Path, env, extra=()):
        self.process = subprocess.Popen(
            [
                str(sluice_bin), "run", str(spec), "--listen", "127.0.0.1:0",
                "--ring-dir", str(tmp_path / "rings"), "--state-dir", str(tmp_path / "state"),
                "--ring-size", str(8 << 20), *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = self.process.stdout.readline()
        assert " serving on " in line, f"expected the AM's address, got {line!r}"
        self.address = line.rsplit(" serving on ", 1)[1].split()[0]
        threading.Thread(target=self.process.stdout.read, daemon=True).start()
        self.stderr = []
        threading.Thread(target=lambda: self.stderr.append(self.process.stderr.read()), daemon=True).start()

    def succeeds(self) -> None:
        assert self.process.wait(timeout=WATCHDOG_S) == 0, f"sluice run failed: {''.join(self.stderr)[-4000:]}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=WATCHDOG_S)


@pytest.mark.parametrize(
    ("how", "resumed_world_size", "resumed_nodes"),
    [("scale", 3, 1), ("scale", 6, 1), ("resume_from", 3, 1), ("resume_from", 6, 1), ("resume_from", 6, 2)],
)
def test_a_checkpoint_of_four_ranks_resumes_at_another_world_size_with_every_row_once(sluice_bin, tmp_path, how, resumed_world_size, resumed_nodes):
    """`scale`: the live job is scaled (`sluice scale`) once the four ranks saved their states.
    `resume_from`: the job is stopped (SIGTERM) and run again with the new `roles[].num` (and node
    count) and `--resume-from TOKEN`."""
    rows = 12000
    data = tmp_path / "data"
    generate(sluice_bin, data, rows)
    out = tmp_path / "out"
    out.mkdir()
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    spec = tmp_path / "job.yaml"
    write_spec(spec, tmp_path, data, trainer, out, SAVED_WORLD_SIZE)
    env = dict(os.environ)
    env.pop("SLUICE_TOKEN", None)

    def every_rank_saved():
        return all((out / f"saved-{rank}.json").exists() for rank in range(SAVED_WORLD_SIZE))

    run = Run(sluice_bin, tmp_path, spec, env)
    try:
        wait_until(every_rank_saved, "the four ranks' checkpoint", timeout_s=WATCHDOG_S)
        if how == "scale":
            scaled = subprocess.run(
                [str(sluice_bin), "scale", "worker", str(resumed_world_size), "--am", run.address],
                env=env,
                capture_output=True,
                text=True,
                timeout=WATCHDOG_S,
            )
            assert scaled.returncode == 0, scaled.stderr
        else:
            run.process.send_signal(signal.SIGTERM)
            run.process.wait(timeout=WATCHDOG_S)
            token = read_json(out / "saved-0.json")["state"]["token"]
            write_spec(spec, tmp_path, data, trainer, out, resumed_world_size, resumed_nodes)
            run = Run(sluice_bin, tmp_path, spec, env, ["--resume-from", token])
        run.succeeds()
    finally:
        run.kill()

    saved = [read_json(out / f"saved-{rank}.json") for rank in range(SAVED_WORLD_SIZE)]
    tokens = {state["state"]["token"] for state in saved}
    assert len(tokens) == 1, f"the four ranks committed one checkpoint: {tokens}"
    before = [row for state in saved for row in state["ids"]]
    assert len(before) == SAVED_WORLD_SIZE * CHECKPOINT_STEP * 250
    resumed = [read_json(out / f"resumed-{rank}-of-{resumed_world_size}.json") for rank in range(resumed_world_size)]
    assert all(part is not None for part in resumed), "every new rank read to the end of the job"
    after = [row for part in resumed for row in part["ids"]]
    assert all(part["step"] >= CHECKPOINT_STEP for part in resumed), "the new ranks count steps from the checkpoint's"
    assert not set(before) & set(after), "rows consumed at the checkpoint came again"
    assert len(after) == len(set(after)), "rows came twice after the resume"
    assert sorted(before + after) == list(range(rows)), "every row exactly once across the change of world size"
