"""Trainers launched by someone else: a job whose AM launches nothing (``launcher: { kind: external
}``), its daemon started by hand, and two ``sluice.Reader()`` trainers started as torchrun starts
them, with their ranks and ``SLUICE_AM`` alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import WATCHDOG_S

TRAINER = r"""
import json, sys
import sluice

reader = sluice.Reader()
ids = []
token = None
for batch in reader:
    ids.extend(batch.column("id").to_pylist())
    if token is None:
        # Every rank commits the same step: the rank and world size come from RANK and WORLD_SIZE.
        token = reader.state_dict(step=1)["token"]
json.dump({"rank": reader.rank, "world_size": reader.world_size, "ids": ids, "token": token, "ring": reader.path}, open(sys.argv[1], "w"))
"""


def test_trainers_started_by_torchrun_find_their_rings_and_read_every_row_once(make_job, tmp_path):
    job = make_job("attach_v1.0", rows=6000, task_rows=500, batch_size=250)
    text = job.spec.read_text()
    text = text.replace(
        "roles:\n  - { name: worker, num: 1, command: [python3, train.py] }",
        "launcher: { kind: external }\nroles:\n  - { name: worker, num: 2 }",
    )
    assert "kind: external" in text
    job.spec.write_text(text)
    am = job.start_am()
    job.start_daemon()
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    trainers = []
    for rank in range(2):
        env = dict(os.environ)
        for name in ("SLUICE_RING", "SLUICE_RANK", "SLUICE_WORLD_SIZE", "SLUICE_JOB", "SLUICE_TOKEN"):
            env.pop(name, None)
        env.update(
            SLUICE_AM=job.am_address,
            SLUICE_RING_DIR=str(job.rings),
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
        )
        out = tmp_path / f"rank-{rank}.json"
        trainers.append((out, subprocess.Popen([sys.executable, str(script), str(out)], env=env)))
    results = []
    for out, process in trainers:
        assert process.wait(timeout=WATCHDOG_S) == 0
        results.append(json.loads(out.read_text()))
    assert am.wait(timeout=WATCHDOG_S) == 0, "the AM exits 0 once the job succeeded"

    assert [result["rank"] for result in results] == [0, 1]
    assert all(result["world_size"] == 2 for result in results)
    assert [os.path.basename(result["ring"]) for result in results] == ["0.ring", "1.ring"]
    assert results[0]["token"] == results[1]["token"], "both ranks committed the same checkpoint"
    seen = sorted(i for result in results for i in result["ids"])
    assert seen == list(range(job.rows)), "every row exactly once"


def test_a_trainer_with_neither_a_ring_nor_ranks_is_told_how_to_start(make_job, tmp_path):
    env = dict(os.environ)
    for name in ("SLUICE_RING", "SLUICE_RANK", "RANK", "SLURM_PROCID"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", "import sluice; sluice.Reader()"], env=env, capture_output=True, text=True, timeout=WATCHDOG_S
    )
    assert result.returncode != 0
    assert "torchrun" in result.stderr and "SLUICE_RING" in result.stderr, result.stderr
