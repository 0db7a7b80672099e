"""`data.even_batches` under data-parallel trainers that step in lockstep: four ranks on two nodes,
each step an all-reduce over gloo (as DDP does), tasks of uneven sizes, so that the rings get
different numbers of batches and the epochs' tails are re-split to the rings that ran dry. Every
rank gets the same number of batches in every epoch. With `pad`, the pad rows are marked and repeat
rows its node had, and every row passing the filter is delivered exactly once per epoch; with
`drop`, no row is delivered twice, the rows left out are counted and named, and the next epoch
delivers them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pyarrow.compute
import pyarrow.dataset
import pytest

from conftest import WATCHDOG_S, am_status, free_port, generate, run_example, serving_address, wait_until

RANKS = 4
EPOCHS = 3
ROWS = 9000

# Each rank reads its ring epoch by epoch; every batch is a step that all-reduces across the ranks,
# so a rank that ran out of batches before the others would leave them waiting in the all-reduce
# (gloo's timeout then fails the job). It writes per epoch its batches, its pad batches, the ids of
# its rows and the ids of its pad rows.
TRAINER = r"""
import datetime, json, os, sys, time
import torch
import torch.distributed as dist
import sluice

out, epochs_to_read, pause_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rank, world_size = int(os.environ["SLUICE_RANK"]), int(os.environ["SLUICE_WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))
reader = sluice.Reader()
epochs = []
for epoch in range(epochs_to_read):
    seen = {"batches": 0, "pads": 0, "ids": [], "pad_ids": []}
    for batch in reader:
        pad = batch.column("_sluice_pad").to_pylist()
        ids = batch.column("id").to_pylist()
        padded = all(pad) and len(pad) > 0
        assert padded or not any(pad), "a batch is all pad rows or none"
        seen["batches"] += 1
        seen["pads"] += int(padded)
        (seen["pad_ids"] if padded else seen["ids"]).extend(ids)
        step = torch.tensor([1.0])
        dist.all_reduce(step)
        assert step.item() == world_size, "every rank took this step"
        time.sleep(pause_s)
    epochs.append(seen)
    counts = torch.tensor([seen["batches"]], dtype=torch.int64)
    most, least = counts.clone(), counts.clone()
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    assert most.item() == least.item(), f"epoch {epoch}: {least.item()} to {most.item()} batches per rank"
with open(os.path.join(out, f"rank-{rank}.json.tmp"), "w") as file:
    json.dump(epochs, file)
os.replace(os.path.join(out, f"rank-{rank}.json.tmp"), os.path.join(out, f"rank-{rank}.json"))
dist.destroy_process_group()
"""


def run_even_job(sluice_bin, tmp_path, even: str, daemon_killed: bool, source_extra: str, shuffle: str):
    """Runs the lockstep trainers over a job with `data.even_batches: even`; returns the generated
    data, each rank's epochs, the run's stdout and stderr, and the last `sluice status --json` seen
    while it ran. `daemon_killed`: node 1's daemon is
    killed with SIGKILL in the second epoch, and started again by `sluice run`; it takes its rings
    over and counts on from the tags of the batches in them."""
    data = tmp_path / "data"
    generate(sluice_bin, data, ROWS)
    out = tmp_path / "out"
    out.mkdir()
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    spec = tmp_path / "job.yaml"
    pause_s = 0.03 if daemon_killed else 0.0
    # Two files of 4,500 rows, tasks of at most 1,000: ten tasks of 1,000 and 500 rows for four
    # rings; batches of exactly 100 rows but a task's last.
    spec.write_text(
        f"""
name: even-{os.getpid()}
data:
  sources: [{{ uri: "file://{data}", format: parquet{source_extra} }}]
  task_rows: 1000
  batch_size: 100
  epochs: {EPOCHS}
{shuffle}  fixed_batch_size: true
  even_batches: {even}
nodes: 2
roles:
  - {{ name: worker, num: {RANKS}, command: ["{sys.executable}", "{trainer}", "{out}", "{EPOCHS}", "{pause_s}"] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 30000 }}
"""
    )
    # The AM logs each re-split and each drop at info. Rings of 64 KiB hold a few batches only, so
    # that a daemon cannot write its tasks whole into rings whose trainers wait on a dry one: the
    # tail of every epoch must be re-split to the dry ring, while the full rings' daemon asks for
    # work too.
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), SLUICE_LOG="warn,sluice_am::master=info")
    env.pop("SLUICE_TOKEN", None)
    state = tmp_path / "state"
    process = subprocess.Popen(
        [
            str(sluice_bin), "run", str(spec), "--listen", "127.0.0.1:0",
            "--ring-dir", str(tmp_path / "rings"), "--state-dir", str(state),
            "--ring-size", str(64 << 10),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr, statuses = [], [], []

    def watch(address):
        while process.poll() is None:
            try:
                shown = am_status(sluice_bin, address, env)
            except (subprocess.SubprocessError, ValueError):
                shown = {}  # the job ended meanwhile
            if shown:
                statuses.append(shown)
            time.sleep(0.1)

    try:
        address = serving_address(process)
        readers = [
            threading.Thread(target=lambda: stdout.append(process.stdout.read()), daemon=True),
            threading.Thread(target=lambda: stderr.append(process.stderr.read()), daemon=True),
            threading.Thread(target=watch, args=(address,), daemon=True),
        ]
        for reader in readers:
            reader.start()
        if daemon_killed:
            wait_until(
                lambda: am_status(sluice_bin, address, env).get("epoch", 0) >= 1
                and am_status(sluice_bin, address, env)["tasks"]["rows_consumed"] > 0,
                "the second epoch under way",
                timeout_s=WATCHDOG_S,
            )
            daemon = int((state / "daemon-1.pid").read_text().split()[2])
            os.kill(daemon, signal.SIGKILL)
        assert process.wait(timeout=WATCHDOG_S) == 0, f"sluice run failed: {''.join(stderr)[-4000:]}"
        for reader in readers:
            reader.join(timeout=WATCHDOG_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=WATCHDOG_S)
    if daemon_killed:
        launches = (state / "daemon-1.log").read_text().count("launching daemon-1")
        assert launches == 2, f"node 1's daemon was started again: {launches} launches"
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(RANKS)]
    return data, ranks, "".join(stdout), "".join(stderr), statuses[-1] if statuses else {}


@pytest.mark.parametrize("daemon_killed", [False, True])
def test_four_lockstep_ranks_get_equal_batches_with_marked_pads_and_every_row_once(sluice_bin, tmp_path, daemon_killed):
    """With `pad` and a filter that keeps about two rows of three."""
    data, ranks, _, run_stderr, _ = run_even_job(
        sluice_bin, tmp_path, "pad", daemon_killed, ', filter: "feature_1 >= 0.3"', "  shuffle: { seed: 11 }\n"
    )
    table = pyarrow.dataset.dataset(str(data)).to_table(columns=["id"], filter=pyarrow.compute.field("feature_1") >= 0.3)
    kept = sorted(table.column("id").to_pylist())
    pads = 0
    for epoch in range(EPOCHS):
        counts = [ranks[rank][epoch]["batches"] for rank in range(RANKS)]
        assert len(set(counts)) == 1, f"epoch {epoch}: batches per rank {counts}"
        delivered = sorted(row for rank in range(RANKS) for row in ranks[rank][epoch]["ids"])
        assert delivered == kept, f"epoch {epoch}: every row passing the filter exactly once"
        for rank in range(RANKS):
            seen = ranks[rank][epoch]
            pads += seen["pads"]
            # A ring pads with its last rows, or with rows of the other ring of its node when it got
            # none yet (ranks 0 and 1 are node 0's, 2 and 3 node 1's).
            node = range(rank - rank % 2, rank - rank % 2 + 2)
            had = {row for other in node for earlier in ranks[other][: epoch + 1] for row in earlier["ids"]}
            assert set(seen["pad_ids"]) <= had, f"rank {rank}, epoch {epoch}: pads repeat rows its node had"
    assert pads > 0, "the rings got the same number of batches in every epoch: nothing was padded"
    assert "task re-split" in run_stderr, "no epoch's tail was re-split to a ring that ran dry"


# The AM's log line for each drop: its epoch, split, first split row and rows.
DROP_LOG = re.compile(r"rows left out of the epoch.*?epoch=(\d+) split=(\d+) first_row=(\d+) rows=(\d+)")


@pytest.mark.parametrize("daemon_killed", [False, True])
def test_four_lockstep_ranks_get_equal_batches_by_dropping_and_read_the_dropped_rows_next(sluice_bin, tmp_path, daemon_killed):
    """With `drop`, no filter and no shuffle, so that a task holds the same rows in every epoch.
    Every rank gets the same number of batches in every epoch, no row twice; the rows an epoch did
    not deliver are the ones the AM logged dropped and the run's summary counts, and the next epoch
    delivers them. With the daemon killed, the batches it held are lost and read again, and a ring
    it feeds may pad up to what the others were allowed."""
    _, ranks, run_stdout, run_stderr, status = run_even_job(sluice_bin, tmp_path, "drop", daemon_killed, "", "")
    everything = set(range(ROWS))
    logged = [0] * EPOCHS
    for epoch, _, _, rows in DROP_LOG.findall(re.sub("\x1b\\[[0-9;]*m", "", run_stderr)):
        logged[int(epoch)] += int(rows)
    pads = 0
    missing = []
    for epoch in range(EPOCHS):
        counts = [ranks[rank][epoch]["batches"] for rank in range(RANKS)]
        assert len(set(counts)) == 1, f"epoch {epoch}: batches per rank {counts}"
        delivered = [row for rank in range(RANKS) for row in ranks[rank][epoch]["ids"]]
        assert len(delivered) == len(set(delivered)), f"epoch {epoch}: a row delivered twice"
        assert set(delivered) <= everything
        missing.append(everything - set(delivered))
        pads += sum(ranks[rank][epoch]["pads"] for rank in range(RANKS))
        if daemon_killed:
            # A drop told just before the daemon died may have been read again and delivered.
            assert len(missing[epoch]) <= logged[epoch], f"epoch {epoch}: {len(missing[epoch])} rows missing, {logged[epoch]} dropped"
        else:
            assert len(missing[epoch]) == logged[epoch], f"epoch {epoch}: {len(missing[epoch])} rows missing, {logged[epoch]} dropped"
    assert sum(logged) > 0, "the rings got the same number of batches in every epoch: nothing was dropped"
    assert f"even batches: {sum(logged)} rows dropped" in run_stdout + run_stderr, "the run's summary counts the drops"
    # The status the AM served last lists the drops it knew of then, each with its file and rows.
    assert 0 < status["dropped_rows"] <= sum(logged), status
    assert sum(drop["row_count"] for drop in status["dropped"]) == status["dropped_rows"]
    assert all(drop["uri"].startswith("file://") and drop["uri"].endswith(".parquet") for drop in status["dropped"])
    if not daemon_killed:
        assert pads == 0, "a ring padded, though no daemon lost the batches it held"
        for epoch in range(EPOCHS - 1):
            delivered_next = {row for rank in range(RANKS) for row in ranks[rank][epoch + 1]["ids"]}
            assert missing[epoch] <= delivered_next, f"epoch {epoch + 1} delivers what epoch {epoch} dropped"


@pytest.mark.parametrize("example", ["even_batches.yaml", "even_batches_drop.yaml"])
def test_the_ddp_example_steps_every_rank_alike_and_masks_its_pads(sluice_bin, tmp_path, example):
    """`examples/even_batches.yaml` (pad) and `examples/even_batches_drop.yaml` (drop) with
    `examples/train_ddp.py`, as their comments run them."""
    data = tmp_path / "data"
    subprocess.run(
        [str(sluice_bin), "gen", "--out", str(data), "--rows", "60000", "--files", "4", "--row-group-rows", "5000"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    env = dict(os.environ, SLUICE_EXAMPLE_DATA=str(data), MASTER_PORT=str(free_port()))
    printed = run_example(sluice_bin, tmp_path, example, env, RANKS)
    for epoch in range(2):
        steps = {line["rank"]: line["steps"] for line in printed if line["epoch"] == epoch}
        assert sorted(steps) == list(range(RANKS)), f"epoch {epoch}: every rank printed its steps"
        assert len(set(steps.values())) == 1, f"epoch {epoch}: steps per rank {steps}"
