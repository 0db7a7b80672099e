"""The Python reader against a real AM and node daemon: zero copy, exactly-once delivery, leases,
data checkpoints across a restart of every process, and the errors a trainer can meet."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pyarrow as pa
import pytest

import sluice
from conftest import run_python, wait_until


def column_buffers(batch: pa.RecordBatch):
    for column in batch.columns:
        for buffer in column.buffers():
            if buffer is not None and buffer.size > 0:
                yield buffer


def test_batches_point_into_the_ring_mapping(make_job):
    job = make_job("zero-copy", rows=2000)
    job.start()
    reader = sluice.Reader(str(job.ring))
    start, end = reader.data_region()
    batches = 0
    for batch in reader:
        buffers = list(column_buffers(batch))
        assert buffers, "a batch with data has buffers"
        for buffer in buffers:
            assert start <= buffer.address and buffer.address + buffer.size <= end, (
                f"buffer at {buffer.address:#x}+{buffer.size} lies outside the ring's data region [{start:#x}, {end:#x})"
            )
        batches += 1
    assert batches == 2000 // 250


def test_every_generated_row_arrives_once_with_its_values(make_job):
    job = make_job("end-to-end", rows=6000)
    job.start()
    expected = job.expected_table()
    reader = sluice.Reader(str(job.ring))
    seen = []
    for batch in reader:
        ids = batch.column("id")
        seen.extend(ids.to_pylist())
        rows = expected.take(ids)
        for name in batch.schema.names:
            assert batch.column(name).equals(rows.column(name).combine_chunks()), f"column {name} differs from the generated data"
    assert list(iter(reader)) == [], "the daemon closed the ring at the end of the job"
    assert len(seen) == len(set(seen)), "some ids arrived twice"
    assert sorted(seen) == expected.column("id").to_pylist(), "every generated id arrives"
    job.processes[0].wait(timeout=60)
    assert job.processes[0].returncode == 0, "the job succeeded"


def test_a_lease_keeps_its_batch_while_later_batches_are_read(make_job):
    job = make_job("lease", rows=6000)
    job.start()
    reader = sluice.Reader(str(job.ring))
    batches = iter(reader)
    first = next(batches)
    lease = reader.lease()
    assert lease.batch is first
    held = first.to_pylist()
    rows_behind = first.num_rows
    for _ in range(4):
        rows_behind += next(batches).num_rows
    current = next(batches)
    assert reader._native.position() <= first_position(lease), "the read cursor stops at the held lease"
    assert reader.positions == {}, "nothing counts as consumed behind the held lease"
    time.sleep(0.5)  # ten heartbeats of the daemon: consumed must not move meanwhile
    assert job.status()["tasks"]["rows_consumed"] == 0
    assert lease.batch.to_pylist() == held, "the leased batch is intact"

    lease.release()
    assert lease.released
    wait_until(lambda: job.status()["tasks"]["rows_consumed"] == rows_behind, "the daemon to count the released batches")
    assert sum(reader.positions.values()) > 0
    assert current.num_rows > 0


def first_position(lease: sluice.Lease) -> int:
    return lease._record.position


TRAINER = r"""
import json, sys
import sluice
reader = sluice.Reader()
batches = iter(reader)
ids = []
for _ in range({before}):
    ids.extend(next(batches).column("id").to_pylist())
state = reader.state_dict()
print(json.dumps({{"state": state, "ids": ids}}), flush=True)
for _ in range(3):
    next(batches)
print("trained past the checkpoint", flush=True)
sys.stdin.read()
"""


def test_a_checkpoint_resumes_a_restarted_job_exactly_after_it(make_job):
    job = make_job("checkpoint", rows=6000)
    job.start()
    trainer = run_python(TRAINER.format(before=7), job.trainer_env())
    job.processes.append(trainer)
    line = trainer.stdout.readline()
    assert line, f"the trainer died: {trainer.stderr.read()}"
    checkpoint = json.loads(line)
    assert trainer.stdout.readline().strip() == "trained past the checkpoint"
    state, before = checkpoint["state"], checkpoint["ids"]
    assert state["step"] == 7 and state["epoch"] == 0 and state["token"]
    job.kill_all()
    # The rings of the dead processes go, as `sluice gc` (or the new daemon) removes them: a new
    # trainer must not take over the old ring before the new daemon starts.
    gc = subprocess.run([str(job.sluice_bin), "gc", "--dir", str(job.rings)], check=True, capture_output=True, text=True)
    assert f"removed {job.ring}" in gc.stdout, gc.stdout

    job.start_am("--resume-from", state["token"])
    job.start_daemon()
    reader = sluice.Reader(str(job.ring), am=job.am_address, rank=0, world_size=1)
    reader.load_state_dict(state)
    assert reader.step == 7
    after = [value for batch in reader for value in batch.column("id").to_pylist()]
    assert not set(before) & set(after), "rows before the checkpoint came again"
    assert len(after) == len(set(after))
    assert sorted(before + after) == list(range(job.rows)), "every row exactly once across the restart"


def test_a_reader_that_read_refuses_to_roll_back_and_names_resume_from(make_job):
    job = make_job("live-restore", rows=2000)
    job.start()
    reader = sluice.Reader(str(job.ring), am=job.am_address, rank=0, world_size=1)
    next(iter(reader))
    state = reader.state_dict()
    with pytest.raises(sluice.SluiceError, match="--resume-from " + state["token"]):
        reader.load_state_dict(state)
    del reader  # gives the consumer role up

    fresh = sluice.Reader(str(job.ring), am=job.am_address, rank=0, world_size=1)
    with pytest.raises(sluice.SluiceError, match="not a sluice reader state"):
        fresh.load_state_dict({"step": 3})
    # A checkpoint is the job's: the state another rank of another world size saved loads too.
    fresh.load_state_dict(dict(state, rank=1, world_size=2))
    assert fresh.step == 1 and fresh.epoch == 0


def test_a_missing_ring_and_a_dead_daemon_raise_clear_errors(make_job, tmp_path):
    with pytest.raises(sluice.SluiceError, match="no ring at .*check SLUICE_RING"):
        sluice.Reader(str(tmp_path / "absent.ring"), wait_s=0.1)
    # A file that is there but is no ring is refused at once: only an absent ring is waited for.
    (tmp_path / "bad.ring").write_bytes(b"not a ring")
    with pytest.raises(sluice.SluiceError, match="truncated or not a sluice ring"):
        sluice.Reader(str(tmp_path / "bad.ring"), wait_s=600)
    job = make_job("dead-daemon", rows=2000)
    job.start()
    reader = sluice.Reader(str(job.ring), peer_timeout_s=0.5)
    batches = iter(reader)
    next(batches)
    job.processes[0].send_signal(signal.SIGKILL)  # the AM: the daemon cannot be replaced
    job.processes[1].send_signal(signal.SIGKILL)
    with pytest.raises(sluice.SluiceError, match="no live producer"):
        for _ in batches:
            pass
