"""Per-batch cost of the Python reader (`sluice.Reader`) against bare pyarrow, side by side.

    python3 benches/python_reader.py [--batches 2000] [--runs 3] [--sluice target/release/sluice]

Writes a Parquet file of `batches` x 1,024 rows and 10 columns (int64, float32, float64), runs
`sluice am` and `sluice daemon` over it with batches of 1,024 rows into a ring in /dev/shm, as one
task (a daemon holds at most two tasks per ring, so one task lets it write the whole data ahead),
lets the daemon write every batch (until the ring's write cursor stays still for a second), then times
`for batch in reader` over every batch: the native call, the release of the previous batch, the
position bookkeeping and pyarrow's in-place decode. Any time the reader still waited on an empty
ring is subtracted. The baseline, in the same run, is what a reader of IPC bytes already in memory costs:
`pa.ipc.read_record_batch(pa.ipc.read_message(buffer), schema)` over one batch's message, as many
times. Prints one JSON object per run and a summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import sluice

ROWS_PER_BATCH = 1024


def table(batches: int) -> pa.Table:
    rows = batches * ROWS_PER_BATCH
    ids = pa.array(range(rows), pa.int64())
    columns = {"id": ids, "label": pc.cast(pc.bit_wise_and(ids, 1), pa.int64())}
    for index in range(5):
        columns[f"f{index}"] = pc.cast(pc.multiply(ids, index + 1), pa.float32())
    for index in range(3):
        columns[f"d{index}"] = pc.cast(pc.add(ids, index), pa.float64())
    return pa.table(columns)


def baseline(message: pa.Buffer, schema: pa.Schema, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        pa.ipc.read_record_batch(pa.ipc.read_message(message), schema)
    return time.perf_counter() - started


def run_once(sluice_bin: str, data: pathlib.Path, root: pathlib.Path, batches: int, run: int) -> dict:
    name = f"bench-python-{os.getpid()}-{run}"
    spec = root / f"{name}.yaml"
    spec.write_text(
        f"""
name: {name}
data:
  sources: [{{ uri: "file://{data}", format: parquet }}]
  task_rows: {ROWS_PER_BATCH * batches}
  batch_size: {ROWS_PER_BATCH}
nodes: 1
roles:
  - {{ name: worker, num: 1, command: [python3] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 30000 }}
"""
    )
    rings = pathlib.Path("/dev/shm") / f"sluice-{name}"
    env = dict(os.environ)
    env.pop("SLUICE_TOKEN", None)
    am = subprocess.Popen([sluice_bin, "am", str(spec), "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True, env=env)
    daemon = None
    try:
        address = am.stdout.readline().strip().rsplit(" ", 1)[-1]
        daemon = subprocess.Popen([sluice_bin, "daemon", "--am", address, "--ring-dir", str(rings), "--ring-size", str(512 << 20)], env=env)
        reader = sluice.Reader(str(rings / name / "0.ring"))
        batches_iter = iter(reader)
        first = next(batches_iter)
        schema = first.schema
        message = pa.py_buffer(first.serialize().to_pybytes())
        # The daemon's head start: every batch waits in the ring before the clock starts, so the run
        # measures the reader alone.
        stable_since, last_write = time.monotonic(), -1
        while time.monotonic() - stable_since < 1.0:
            write, _ = reader._native.cursors()
            if write != last_write:
                stable_since, last_write = time.monotonic(), write
            time.sleep(0.05)
        waited_before = reader._native.empty_wait_s
        started = time.perf_counter()
        count = 0
        for batch in batches_iter:
            count += batch.num_rows // ROWS_PER_BATCH
        elapsed = time.perf_counter() - started
        waited = reader._native.empty_wait_s - waited_before
        assert count == batches - 1, f"read {count + 1} batches of {batches}"
        reader_s = elapsed - waited
        baseline_s = baseline(message, schema, count)
        return {
            "run": run,
            "batches": count,
            "columns": len(schema),
            "reader_us_per_batch": round(reader_s / count * 1e6, 2),
            "waited_s": round(waited, 3),
            "baseline_us_per_batch": round(baseline_s / count * 1e6, 2),
            "overhead_us_per_batch": round((reader_s - baseline_s) / count * 1e6, 2),
            "ratio": round(reader_s / baseline_s, 2),
        }
    finally:
        for process in (daemon, am):
            if process is not None:
                process.kill()
                process.wait()
        shutil.rmtree(rings, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sluice", default=os.environ.get("SLUICE_BIN", "target/release/sluice"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        root = pathlib.Path(directory)
        data = root / "data.parquet"
        pq.write_table(table(args.batches), data, row_group_size=ROWS_PER_BATCH * args.batches)
        results = [run_once(args.sluice, data, root, args.batches, run) for run in range(args.runs)]
    for result in results:
        print(json.dumps(result))
    overheads = sorted(result["overhead_us_per_batch"] for result in results)
    print(f"median overhead {overheads[len(overheads) // 2]} us per batch over bare pyarrow (target <= 10 us)")


if __name__ == "__main__":
    main()
