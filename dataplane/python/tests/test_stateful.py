"""`sluice.torch.Dataset` as a `Stateful` inside torchdata's `StatefulDataLoader`, against a real AM
and node daemon: `state_dict()` is a local position, the AM hears of it when the state is pickled,
and the loader states two ranks saved with `torch.save` resume in new processes with every row of
every epoch once."""

from __future__ import annotations

import copy
import io
import json
import pathlib
import time

import pytest
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torchdata.stateful_dataloader import StatefulDataLoader

import sluice
from conftest import WATCHDOG_S, run_python
from sluice.torch import Dataset, PendingToken, commit


def stored_checkpoints(job) -> list:
    """The data checkpoints the AM stored: one object per token under its checkpoint location."""
    directory = job.root / "ckpt" / "data-checkpoints"
    return sorted(path.name for path in directory.glob("*.json")) if directory.exists() else []


def test_a_state_is_a_local_position_that_commits_once_when_pickled(make_job):
    job = make_job("lazy-state", rows=3000)
    job.start()
    dataset = Dataset(str(job.ring), am=job.am_address, rank=0, world_size=1)
    assert isinstance(dataset, Stateful), "torch.distributed.checkpoint's protocol"
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=0)
    items = iter(loader)
    for _ in range(3):
        next(items)

    calls = 2000
    started = time.perf_counter()
    for _ in range(calls):
        state = loader.state_dict()
    per_call_us = (time.perf_counter() - started) / calls * 1e6
    print(f"StatefulDataLoader.state_dict() over sluice.torch.Dataset: {per_call_us:.1f} us per call")
    token = state["dataset_state"]["token"]
    assert isinstance(token, PendingToken) and token.token is None
    assert copy.copy(state)["dataset_state"]["token"] is token
    assert copy.deepcopy(state)["dataset_state"]["token"] is token
    assert token.token is None and stored_checkpoints(job) == [], "neither state_dict() nor a copy calls the AM"

    saved = io.BytesIO()
    torch.save(state, saved)
    assert token.token is not None
    assert stored_checkpoints(job) == [f"{token.token}.json"], "pickling the state committed it"
    torch.save(state, io.BytesIO())
    assert stored_checkpoints(job) == [f"{token.token}.json"], "a state commits once"

    # With weights_only=True, torch.load's default: the token comes back a str.
    loaded = torch.load(io.BytesIO(saved.getvalue()))
    assert loaded["dataset_state"] == {"version": 1, "token": token.token, "step": 3, "epoch": 0, "world_size": 1}
    assert type(loaded["dataset_state"]["token"]) is str
    # The third item, which the loop still holds, counts as consumed in the AM's checkpoint.
    position = json.loads((job.root / "ckpt" / "data-checkpoints" / f"{token.token}.json").read_text())
    assert position["done_rows"] == 3 * 250


def test_a_state_of_an_earlier_step_and_an_eager_commit(make_job):
    job = make_job("earlier-step", rows=2000)
    job.start()
    dataset = Dataset(str(job.ring), am=job.am_address, rank=0, world_size=1, keep_batches=2)
    items = iter(dataset)
    for _ in range(3):
        next(items)
    earlier = dataset.state_dict(step=2)
    assert earlier["step"] == 2 and earlier["token"].step == 2
    with pytest.raises(sluice.SluiceError, match=r"state_dict\(step=9\): the dataset is at step 3"):
        dataset.state_dict(step=9)

    committed = dataset.checkpoint(step=2)
    assert type(committed["token"]) is str and stored_checkpoints(job) == [f"{committed['token']}.json"]
    nested = commit({"loader": [earlier], "other": 1})
    assert nested == {"loader": [committed], "other": 1}, "commit() replaces a pending token found inside dicts and lists"
    position = json.loads((job.root / "ckpt" / "data-checkpoints" / f"{committed['token']}.json").read_text())
    assert position["done_rows"] == 2 * 250, "the state of step 2 leaves the third item out"

    with pytest.raises(sluice.SluiceError, match="keep_batches=0"):
        Dataset(str(job.ring), keep_batches=0)


# Each rank: a StatefulDataLoader over its ring. The first run saves the loader's state with
# torch.save at step `save_at` (every rank pickles it, which commits the step), reads past it and
# stops as a crash would. The resumed run loads it with torch.load in a new process and reads to the end
# of the job; each rank restores the checkpoint as it starts, the first to ask reading on before the
# last asks.
TRAINER = r"""
import json, os, sys
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from sluice.torch import Dataset

out, phase, save_at, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rank = int(os.environ["SLUICE_RANK"])
dataset = Dataset()
loader = StatefulDataLoader(dataset, batch_size=None, num_workers=0)
path = f"{out}/loader-{rank}.pt"
first_epoch, ids = 0, []
if phase == "resume":
    saved = torch.load(path)
    loader.load_state_dict(saved["loader"])
    first_epoch = saved["epoch"]
    batches = iter(loader)  # gives the dataset its state, which the AM restores at the first item
else:
    batches = iter(loader)
for epoch in range(first_epoch, epochs):
    if epoch != first_epoch:
        batches = iter(loader)
    for item in batches:
        ids.append([epoch, item["id"].tolist()])
        if phase == "first" and len(ids) == save_at:
            torch.save({"loader": loader.state_dict(), "epoch": epoch}, path)
            saved_ids = list(ids)
        if phase == "first" and len(ids) == save_at + 2:
            with open(f"{out}/first-{rank}.json", "w") as file:
                json.dump(saved_ids, file)
            sys.exit(0)
with open(f"{out}/{phase}-{rank}.json", "w") as file:
    json.dump(ids, file)
"""


def run_trainers(job, out: pathlib.Path, phase: str, save_at: int, epochs: int) -> list:
    """Runs a trainer per rank to its end; returns the (epoch, ids) of the steps they kept."""
    trainers = [
        run_python(TRAINER, job.trainer_env(rank), str(out), phase, str(save_at), str(epochs)) for rank in range(job.world_size)
    ]
    job.processes.extend(trainers)
    for rank, trainer in enumerate(trainers):
        _, stderr = trainer.communicate(timeout=WATCHDOG_S)
        assert trainer.returncode == 0, f"the {phase} trainer of rank {rank} failed: {stderr[-4000:]}"
    return [step for rank in range(job.world_size) for step in json.loads((out / f"{phase}-{rank}.json").read_text())]


def test_stateful_dataloaders_saved_mid_epoch_by_two_ranks_resume_in_new_processes_with_every_row_once(make_job, tmp_path):
    epochs, save_at, world_size = 2, 4, 2
    job = make_job("stateful-loader", rows=6000, task_rows=500, epochs=epochs, world_size=world_size)
    job.start()
    out = tmp_path / "out"
    out.mkdir()
    before = run_trainers(job, out, "first", save_at, epochs)
    tokens = {torch.load(out / f"loader-{rank}.pt")["loader"]["dataset_state"]["token"] for rank in range(world_size)}
    assert len(tokens) == 1, f"the ranks committed one checkpoint: {tokens}"
    after = run_trainers(job, out, "resume", save_at, epochs)
    assert len(before) == world_size * save_at
    for epoch in range(epochs):
        rows = [row for seen, ids in before + after if seen == epoch for row in ids]
        assert sorted(rows) == list(range(job.rows)), f"every row of epoch {epoch} exactly once across the restart"
