"""The Python side of `sluice bench suite`: one trainer loop over one data loading system.

    python3 suite_trainer.py SYSTEM --source PATH_OR_URI --batch-rows N [--work-us W] [--workers N]

SYSTEM is one of:

- ``facts``: reads the dataset once with pyarrow and prints its rows and its Arrow bytes (the bytes of
  the Arrow IPC messages of its record batches of ``--batch-rows`` rows, the unit of every GB/s of the
  suite);
- ``probe``: prints which optional systems are importable;
- ``sluice``: ``sluice.Reader`` over the ring in ``SLUICE_RING`` (run as the trainer of a Sluice job);
- ``sluice_torch``: ``DataLoader(sluice.torch.Dataset(), batch_size=None)`` over the same ring;
- ``pyarrow``: a ``pyarrow.dataset`` scan to record batches in this process;
- ``pytorch_dataloader``: a ``DataLoader`` with ``--workers`` worker processes over a Dataset that
  reads the Parquet row groups with pyarrow, split among the workers, and yields one dict per row,
  batched by the default collate;
- ``mosaic_streaming``: MosaicML ``StreamingDataset`` over the dataset converted to MDS (in
  ``--scratch``) before the clock starts, through a ``DataLoader`` with ``--workers`` workers;
- ``ray_data``: ``ray.data.read_parquet(...).iter_batches()``.

Every system runs the same loop, once its imports are done, which it announces with a ``ready``
line: ask for the next batch, count its rows, then spin ``--work-us`` microseconds (the trainer's
simulated per-batch work; 0 in the throughput phase). It prints one JSON line: the rows and batches
seen, the seconds from the start of the loop (opening the reader, creating the iterator) to the end
of the data, the seconds spent waiting for batches after the first one, the seconds until the first
batch, and the window's ends on CLOCK_MONOTONIC in nanoseconds, so that the driver can attribute the
CPU time of the system's processes to the window.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import time
from typing import Any, Callable, Iterable

SYSTEMS = ("sluice", "sluice_torch", "pyarrow", "pytorch_dataloader", "mosaic_streaming", "ray_data")
OPTIONAL = {"mosaic_streaming": "streaming", "ray_data": "ray"}


def spin(nanoseconds: int) -> None:
    """The trainer's work on one batch: a busy loop, as a compute step holds the core."""
    deadline = time.monotonic_ns() + nanoseconds
    while time.monotonic_ns() < deadline:
        pass


def drive(batches: Callable[[], Iterable[Any]], rows_of: Callable[[Any], int], work_us: float) -> dict:
    work_ns = int(work_us * 1000)
    # Everything is imported: the driver starts the node daemon of the Sluice systems on this line, so
    # that all of the daemon's work falls within the window.
    print("ready", flush=True)
    start = time.monotonic_ns()
    iterator = iter(batches())
    rows = 0
    count = 0
    waited_ns = 0
    first_batch_ns = None
    while True:
        asked = time.monotonic_ns()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        got = time.monotonic_ns()
        if first_batch_ns is None:
            first_batch_ns = got - start
        else:
            waited_ns += got - asked
        rows += rows_of(batch)
        count += 1
        del batch
        if work_ns:
            spin(work_ns)
    end = time.monotonic_ns()
    return {
        "rows": rows,
        "batches": count,
        "seconds": (end - start) / 1e9,
        "first_batch_seconds": (first_batch_ns or 0) / 1e9,
        "wait_seconds": waited_ns / 1e9,
        "window_start_ns": start,
        "window_end_ns": end,
    }


def facts(source: str, batch_rows: int) -> dict:
    import pyarrow.dataset as ds

    rows = 0
    arrow_bytes = 0
    batches = 0
    for batch in ds.dataset(source, format="parquet").to_batches(batch_size=batch_rows):
        if batch.num_rows == 0:
            continue
        rows += batch.num_rows
        arrow_bytes += batch.serialize().size
        batches += 1
    return {"rows": rows, "arrow_bytes": arrow_bytes, "batches": batches}


def probe() -> dict:
    return {name: importlib.util.find_spec(module) is not None for name, module in OPTIONAL.items()}


def sluice_reader(args: argparse.Namespace) -> dict:
    import sluice

    return drive(lambda: sluice.Reader(), lambda batch: batch.num_rows, args.work_us)


def sluice_torch(args: argparse.Namespace) -> dict:
    import torch.utils.data

    import sluice.torch

    return drive(
        lambda: torch.utils.data.DataLoader(sluice.torch.Dataset(), batch_size=None),
        lambda item: len(item["id"]),
        args.work_us,
    )


def pyarrow_scan(args: argparse.Namespace) -> dict:
    import pyarrow.dataset as ds

    return drive(
        lambda: ds.dataset(args.source, format="parquet").to_batches(batch_size=args.batch_rows),
        lambda batch: batch.num_rows,
        args.work_us,
    )


def parquet_rows_dataset(source: str):
    """The Dataset users write today: pyarrow reads the row groups, each worker takes its share, and
    every row becomes a dict (nulls of floating-point columns as NaN, which the default collate needs)."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import torch.utils.data

    class ParquetRows(torch.utils.data.IterableDataset):
        def __init__(self, source: str) -> None:
            super().__init__()
            self.source = source

        def __iter__(self):
            dataset = ds.dataset(self.source, format="parquet")
            row_groups = [group for fragment in dataset.get_fragments() for group in fragment.split_by_row_group()]
            info = torch.utils.data.get_worker_info()
            if info is not None:
                row_groups = row_groups[info.id :: info.num_workers]
            floats = {field.name for field in dataset.schema if pa.types.is_floating(field.type)}
            for group in row_groups:
                for row in group.to_table().to_pylist():
                    for name in floats:
                        if row[name] is None:
                            row[name] = math.nan
                    yield row

    return ParquetRows(source)


def pytorch_dataloader(args: argparse.Namespace) -> dict:
    import torch.utils.data

    dataset = parquet_rows_dataset(args.source)
    return drive(
        lambda: torch.utils.data.DataLoader(dataset, batch_size=args.batch_rows, num_workers=args.workers),
        lambda batch: len(batch["id"]),
        args.work_us,
    )


def mosaic_streaming(args: argparse.Namespace) -> dict:
    import pyarrow as pa
    import pyarrow.dataset as ds
    import torch.utils.data
    from streaming import MDSWriter, StreamingDataset

    dataset = ds.dataset(args.source, format="parquet")
    encodings = {}
    for field in dataset.schema:
        if pa.types.is_integer(field.type):
            encodings[field.name] = "int64"
        elif pa.types.is_floating(field.type):
            encodings[field.name] = "float32"
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            encodings[field.name] = "str"
        else:
            encodings[field.name] = "json"
    floats = [name for name, encoding in encodings.items() if encoding == "float32"]
    # The conversion to MDS is the step MosaicML needs before training; it is not timed.
    with MDSWriter(out=args.scratch, columns=encodings) as writer:
        for batch in dataset.to_batches(batch_size=args.batch_rows):
            for row in batch.to_pylist():
                for name in floats:
                    if row[name] is None:
                        row[name] = math.nan
                writer.write(row)
    return drive(
        lambda: torch.utils.data.DataLoader(
            StreamingDataset(local=args.scratch, batch_size=args.batch_rows, shuffle=False),
            batch_size=args.batch_rows,
            num_workers=args.workers,
        ),
        lambda batch: len(batch["id"]),
        args.work_us,
    )


def ray_data(args: argparse.Namespace) -> dict:
    import ray

    ray.init(num_cpus=None, include_dashboard=False, log_to_driver=False)
    try:
        return drive(
            lambda: ray.data.read_parquet(args.source).iter_batches(batch_size=args.batch_rows, batch_format="pyarrow"),
            lambda batch: batch.num_rows,
            args.work_us,
        )
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=("facts", "probe") + SYSTEMS)
    parser.add_argument("--source", help="the dataset: a Parquet file, a directory of them, or a URI pyarrow reads")
    parser.add_argument("--batch-rows", type=int, default=4096)
    parser.add_argument("--work-us", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--scratch", help="where mosaic_streaming writes the MDS copy of the dataset")
    args = parser.parse_args()
    runs = {
        "facts": lambda: facts(args.source, args.batch_rows),
        "probe": probe,
        "sluice": lambda: sluice_reader(args),
        "sluice_torch": lambda: sluice_torch(args),
        "pyarrow": lambda: pyarrow_scan(args),
        "pytorch_dataloader": lambda: pytorch_dataloader(args),
        "mosaic_streaming": lambda: mosaic_streaming(args),
        "ray_data": lambda: ray_data(args),
    }
    print(json.dumps(runs[args.system]()), flush=True)


if __name__ == "__main__":
    main()
