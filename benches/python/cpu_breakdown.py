"""Where the CPU of a Sluice job goes, per million rows, from a `perf` profile of the whole job.

    perf record -k CLOCK_MONOTONIC -F 1999 --call-graph dwarf,32768 -o perf.data -- sluice run JOB ...
    python3 cpu_breakdown.py perf.data --trainer-log STATE/trainer-worker-0.log

The trainer is `suite_trainer.py sluice` (its JSON line gives the window, the rows and the trainer's
pid). Only the samples inside the window count, as in `sluice-bench suite`. Each sample is given to
one part:

- the daemon (the process of the `sluice-decode` threads): ``decode`` (its `sluice-decode` threads:
  Parquet pages to Arrow arrays), ``encode and ring copy`` (its `ring-writer-N` threads: Arrow IPC
  framing straight into the ring), ``io and scheduling`` (its other threads: io_uring, tokio);
- the trainer's process: ``sluice reader`` (stacks through Sluice's extension), ``batch objects``
  (pyarrow building record batches and arrays over the ring's memory), ``to tensors`` (the suite's
  `fill_null` and `torch.from_dlpack`, the same for every system), ``python and other`` (the
  interpreter running the loop, allocation, the kernel);
- ``application master`` (the `sluice run` process and any other `sluice` process but the launcher's
  shims) and ``launcher`` (`sluice-executor` shims).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
from typing import Dict, Iterator, List, Tuple

SAMPLE = re.compile(r"^(?P<comm>.+?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+(?P<time>[\d.]+):")

TRAINER_PARTS = [
    ("sluice reader", re.compile(r"_native\.cpython|sluice_ring|sluice_client|sluice_python")),
    ("to tensors", re.compile(r"Coalesce|FillNull|fill_null|dlpack|DLPack")),
    ("batch objects", re.compile(r"ipc::|Ipc|RecordBatch|pyarrow_wrap|MessageReader|MakeArray")),
]


def samples(perf_data: str, window: Tuple[float, float]) -> Iterator[Tuple[str, int, str]]:
    """(thread name, pid, stack text) of every sample in the window."""
    script = subprocess.run(
        [
            "perf", "script", "-i", perf_data, "--time", f"{window[0]:.6f},{window[1]:.6f}",
            "-F", "comm,pid,tid,time,ip,sym,dso",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    # A sample is its header line (which holds its frame when perf recorded no call graph), then its
    # call graph's frames, indented.
    current = None
    for line in script.stdout.splitlines():
        header = None if line.startswith("\t") else SAMPLE.match(line.lstrip(" "))
        if header:
            if current:
                yield current[0], current[1], "\n".join(current[2])
            current = (header["comm"].strip(), int(header["pid"]), [line.lstrip(" ")[header.end() :]])
        elif current and line.strip():
            current[2].append(line)
    if current:
        yield current[0], current[1], "\n".join(current[2])


def breakdown(perf_data: str, trainer: dict) -> Dict[str, int]:
    window = (trainer["window_start_ns"] / 1e9, trainer["window_end_ns"] / 1e9)
    taken: List[Tuple[str, int, str]] = list(samples(perf_data, window))
    daemons = {pid for comm, pid, _ in taken if comm == "sluice-decode"}
    parts: Dict[str, int] = collections.Counter()
    for comm, pid, stack in taken:
        if pid == trainer["pid"]:
            part = next((name for name, pattern in TRAINER_PARTS if pattern.search(stack)), "python and other")
            parts[f"trainer: {part}"] += 1
        elif pid in daemons:
            if comm == "sluice-decode":
                parts["daemon: decode"] += 1
            elif comm.startswith("ring-writer"):
                parts["daemon: encode and ring copy"] += 1
            else:
                parts["daemon: io and scheduling"] += 1
        elif comm == "sluice-executor":
            parts["launcher"] += 1
        else:
            parts["application master"] += 1
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("perf_data")
    parser.add_argument("--trainer-log", required=True, help="the trainer's log, ending in its JSON line")
    parser.add_argument("--frequency", type=float, default=1999.0, help="perf record's -F")
    args = parser.parse_args()
    lines = [line for line in open(args.trainer_log) if line.startswith("{")]
    trainer = json.loads(lines[-1])
    parts = breakdown(args.perf_data, trainer)
    total = sum(parts.values())
    million_rows = trainer["rows"] / 1e6
    print(f"{trainer['rows']} rows in a window of {trainer['seconds']:.3f} s; {total} samples at {args.frequency:.0f} Hz")
    print(f"{'part':40} {'CPU ms / M rows':>16} {'share':>7}")
    for name, count in sorted(parts.items(), key=lambda item: -item[1]):
        milliseconds = count / args.frequency * 1e3 / million_rows
        print(f"{name:40} {milliseconds:16.1f} {100 * count / total:6.1f}%")
    print(f"{'all':40} {total / args.frequency * 1e3 / million_rows:16.1f} {100.0:6.1f}%")


if __name__ == "__main__":
    main()
