"""The Python side of `sluice bench suite`: one trainer loop over one data loading system.

    python3 suite_trainer.py SYSTEM --source PATH_OR_URI --batch-rows N [--work-us W] [--workers N]

SYSTEM is one of:

- ``facts``: reads the dataset once with pyarrow and prints its rows, its numeric columns, their
  Arrow bytes (the bytes of the Arrow IPC messages of its record batches of ``--batch-rows`` rows
  of those columns, the unit of every GB/s of the suite), their Parquet bytes (the compressed
  column chunks of those columns, what a reader of the numeric columns must fetch at least) and
  which of them are floating-point (whose nulls every system delivers as NaN);
- ``probe``: prints the version of every peer's package, or why it cannot be imported;
- ``mds``: converts the dataset to MDS in ``--scratch`` (see ``mosaic_streaming``) and prints the
  bytes of the MDS files;
- ``sluice``: ``sluice.Reader`` over the ring in ``SLUICE_RING`` (run as the trainer of a Sluice job),
  each batch turned into tensors by :func:`to_tensors`;
- ``sluice_torch``: ``DataLoader(sluice.torch.Dataset(), batch_size=None)`` over the same ring;
- ``pyarrow``: a ``pyarrow.dataset`` scan of the numeric columns in this process, to tensors;
- ``pytorch_dataloader``: ``DataLoader(batch_size=None)`` with ``--workers`` worker processes over an
  ``IterableDataset`` that reads the Parquet row groups with pyarrow, split among the workers, and
  yields one dict of tensors per record batch;
- ``pytorch_dataloader_naive``: a ``DataLoader`` over an ``IterableDataset`` that yields one dict per
  row, batched by the default collate;
- ``torchdata``: torchdata's ``StatefulDataLoader`` over the same Dataset as ``pytorch_dataloader``;
- ``spdl``: an SPDL pipeline (``spdl.pipeline.PipelineBuilder``) in this process, on a thread pool of 2
  threads: its source is the dataset's row groups, file by file; a stage of concurrency 2 reads each
  with pyarrow into record batches of ``--batch-rows`` rows of the numeric columns, as
  ``pytorch_dataloader``'s Dataset does; a stage turns a row group's batches into dicts of tensors,
  which are then disaggregated into a sink of 3 batches;
- ``mosaic_streaming``: MosaicML ``StreamingDataset`` over the rows converted to MDS once (in
  ``--scratch``, reused while its ``_SUCCESS`` marker is there), one MDS sample per batch of numeric
  arrays, through a ``DataLoader(batch_size=None)`` with ``--workers`` workers; with ``--mds-remote
  URI``, over that copy of the MDS files in S3 instead, downloaded into ``--scratch`` as its local
  cache (which the driver gives empty);
- ``ray_data``: ``ray.data.read_parquet(...).iter_torch_batches()``, with Ray started in the window.

Every system delivers the same thing: a dict from the name of each integer or floating-point column to
a tensor of up to ``--batch-rows`` rows (nulls of floating-point columns as NaN). Every system runs the
same loop, once its imports are done, which it announces with a ``ready`` line: ask for the next batch,
count its rows, then compute for ``--work-us`` microseconds (the trainer's per-batch work, matrix
products on one thread that release the GIL as a model's operators do; 0 for an idle trainer). It
prints one JSON line: the rows and batches seen, the seconds from the start of the loop (opening the
reader, creating the iterator) to the end of the data, the seconds spent waiting for batches after the
first one, the seconds until the first batch and its rows, and the window's ends on CLOCK_MONOTONIC in
nanoseconds, so that the driver can attribute the CPU time of the system's processes to the window.

An ``s3://`` source is read through pyarrow's S3 filesystem (:func:`filesystem_of`) by every system
that reads Parquet in Python, at the endpoint in ``AWS_ENDPOINT_URL`` when that is set, with the keys
and region of the environment. ``sluice bench suite --remote`` sets them to its S3 server behind its
delaying proxy.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List

SYSTEMS = (
    "sluice",
    "sluice_torch",
    "pyarrow",
    "pytorch_dataloader",
    "pytorch_dataloader_naive",
    "torchdata",
    "spdl",
    "mosaic_streaming",
    "ray_data",
)
# The distributions whose versions the report gives, and the systems that need each.
DISTRIBUTIONS = {
    "torch": (),
    "pyarrow": (),
    "numpy": ("mosaic_streaming", "ray_data"),
    "sluice": (),
    "torchdata": ("torchdata",),
    "spdl": ("spdl",),
    "mosaicml-streaming": ("mosaic_streaming",),
    "ray": ("ray_data",),
}
MODULES = {
    "torchdata": "torchdata.stateful_dataloader",
    "spdl": "spdl.pipeline",
    "mosaicml-streaming": "streaming",
    "ray": "ray.data",
}
# The rows of one MDS shard file; shards of about 30 MB at the suite's rows.
MDS_SHARD_BYTES = 1 << 25
SUCCESS_MARKER = "_SUCCESS"


class Work:
    """The trainer's work on one batch: matrix products on one thread until the deadline, so that the
    core is busy and the GIL is free for the loader's threads, as with a model's operators."""

    def __init__(self, microseconds: float) -> None:
        import torch

        torch.set_num_threads(1)
        self.nanoseconds = int(microseconds * 1000)
        self.matmul = torch.mm
        self.left = torch.rand(48, 48)
        self.right = torch.rand(48, 48)
        self.out = torch.empty(48, 48)

    def __call__(self) -> None:
        deadline = time.monotonic_ns() + self.nanoseconds
        while time.monotonic_ns() < deadline:
            self.matmul(self.left, self.right, out=self.out)


def drive(batches: Callable[[], Iterable[Any]], rows_of: Callable[[Any], int], work_us: float) -> dict:
    # The modules every system turns batches into tensors with, imported before the window opens.
    import pyarrow
    import pyarrow.compute  # noqa: F401

    importlib.import_module("torch")

    # pyarrow imports pandas (when installed) the first time it makes a scalar of a Python value, as
    # `fill_null(column, nan)` in `to_tensors` does: a third of a 2-million-row run's trainer CPU, in
    # a profile, when it fell in the window. Made here, before it.
    pyarrow.scalar(math.nan)

    work = Work(work_us) if work_us > 0 else None
    # Everything is imported: the driver starts the node daemon of the Sluice systems on this line, so
    # that all of the daemon's work falls within the window.
    print("ready", flush=True)
    start = time.monotonic_ns()
    iterator = iter(batches())
    rows = 0
    count = 0
    waited_ns = 0
    first_batch_ns = None
    first_batch_rows = 0
    while True:
        asked = time.monotonic_ns()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        got = time.monotonic_ns()
        batch_rows = rows_of(batch)
        if first_batch_ns is None:
            first_batch_ns = got - start
            first_batch_rows = batch_rows
        else:
            waited_ns += got - asked
        rows += batch_rows
        count += 1
        del batch
        if work is not None:
            work()
    end = time.monotonic_ns()
    return {
        "pid": os.getpid(),
        "rows": rows,
        "batches": count,
        "seconds": (end - start) / 1e9,
        "first_batch_seconds": (first_batch_ns or 0) / 1e9,
        "first_batch_rows": first_batch_rows,
        "wait_seconds": waited_ns / 1e9,
        "window_start_ns": start,
        "window_end_ns": end,
    }


def numeric_columns(schema) -> List[str]:
    """The columns every system delivers as tensors: the integer and floating-point ones."""
    import pyarrow as pa

    return [field.name for field in schema if pa.types.is_integer(field.type) or pa.types.is_floating(field.type)]


def to_tensors(batch) -> Dict[str, Any]:
    """The columns of a record batch as tensors over its memory (DLPack), with one vectorised copy for a
    floating-point column with nulls, which become NaN."""
    import pyarrow.compute as pc
    import torch

    item = {}
    for name, column in zip(batch.schema.names, batch.columns):
        if column.null_count:
            column = pc.fill_null(column, math.nan)
        item[name] = torch.from_dlpack(column)
    return item


def rows_of_tensors(item: Dict[str, Any]) -> int:
    return len(next(iter(item.values())))


def filesystem_of(source: str):
    """The filesystem and path pyarrow reads ``source`` with: for an ``s3://`` URI, pyarrow's S3
    filesystem, at ``AWS_ENDPOINT_URL`` when that is set (its scheme, host and port; path-style
    requests), with the keys and region of the environment; for anything else, pyarrow's choice."""
    if not source.startswith("s3://"):
        return None, source
    from pyarrow import fs

    options = {"region": os.environ.get("AWS_REGION", "us-east-1")}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        scheme, _, address = endpoint.rpartition("://")
        options.update(endpoint_override=address, scheme=scheme or "https")
    return fs.S3FileSystem(**options), source[len("s3://") :]


def open_dataset(source: str):
    import pyarrow.dataset as ds

    filesystem, path = filesystem_of(source)
    return ds.dataset(path, format="parquet", filesystem=filesystem)


def facts(source: str, batch_rows: int) -> dict:
    import pyarrow as pa

    dataset = open_dataset(source)
    columns = numeric_columns(dataset.schema)
    parquet_bytes = 0
    for fragment in dataset.get_fragments():
        metadata = fragment.metadata
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            for index in range(row_group.num_columns):
                chunk = row_group.column(index)
                if chunk.path_in_schema in columns:
                    parquet_bytes += chunk.total_compressed_size
    rows = 0
    arrow_bytes = 0
    batches = 0
    for batch in dataset.to_batches(batch_size=batch_rows, columns=columns):
        if batch.num_rows == 0:
            continue
        rows += batch.num_rows
        arrow_bytes += batch.serialize().size
        batches += 1
    return {
        "rows": rows,
        "arrow_bytes": arrow_bytes,
        "parquet_bytes": parquet_bytes,
        "batches": batches,
        "columns": columns,
        "float_columns": [name for name in columns if pa.types.is_floating(dataset.schema.field(name).type)],
    }


def probe() -> dict:
    """The version of every distribution, and for each system that cannot run here, why."""
    versions = {}
    missing = {}
    for distribution, systems in DISTRIBUTIONS.items():
        try:
            versions[distribution] = importlib.metadata.version(distribution)
            importlib.import_module(MODULES.get(distribution, distribution.replace("-", "_")))
        except Exception as error:  # an import can fail with anything; the reason is what is reported
            versions.pop(distribution, None)
            for system in systems:
                missing[system] = f"{distribution}: {type(error).__name__}: {error}"
    return {"versions": versions, "missing": missing}


def sluice_reader(args: argparse.Namespace) -> dict:
    import sluice

    return drive(lambda: map(to_tensors, sluice.Reader()), rows_of_tensors, args.work_us)


def sluice_torch(args: argparse.Namespace) -> dict:
    import torch.utils.data

    import sluice.torch

    return drive(
        lambda: torch.utils.data.DataLoader(sluice.torch.Dataset(), batch_size=None),
        rows_of_tensors,
        args.work_us,
    )


def pyarrow_scan(args: argparse.Namespace) -> dict:
    return drive(
        lambda: map(to_tensors, open_dataset(args.source).to_batches(batch_size=args.batch_rows, columns=args.columns)),
        rows_of_tensors,
        args.work_us,
    )


def dataset_row_groups(source: str) -> Iterator:
    """The dataset's row groups, one pyarrow fragment each, file by file: a file's footer is read when
    its turn comes."""
    for fragment in open_dataset(source).get_fragments():
        yield from fragment.split_by_row_group()


def row_groups_of_worker(source: str) -> list:
    """This DataLoader worker's share of the dataset's row groups (all of them in the main process)."""
    import torch.utils.data

    row_groups = list(dataset_row_groups(source))
    info = torch.utils.data.get_worker_info()
    if info is not None:
        row_groups = row_groups[info.id :: info.num_workers]
    return row_groups


def parquet_batches_dataset(args: argparse.Namespace):
    """The Dataset a performance-minded user writes: pyarrow reads each worker's row groups, projected
    to the numeric columns, and every record batch becomes one dict of tensors."""
    import torch.utils.data

    source, columns, batch_rows = args.source, args.columns, args.batch_rows

    class ParquetBatches(torch.utils.data.IterableDataset):
        def __iter__(self):
            for group in row_groups_of_worker(source):
                for batch in group.to_batches(batch_size=batch_rows, columns=columns):
                    yield to_tensors(batch)

    return ParquetBatches()


def parquet_rows_dataset(args: argparse.Namespace):
    """The per-row Dataset: every row becomes a dict, which the default collate batches back."""
    import torch.utils.data

    source, columns = args.source, args.columns

    class ParquetRows(torch.utils.data.IterableDataset):
        def __iter__(self):
            for group in row_groups_of_worker(source):
                for row in group.to_table(columns=columns).to_pylist():
                    yield {name: math.nan if value is None else value for name, value in row.items()}

    return ParquetRows()


def loader_options(workers: int) -> dict:
    """Worker processes, each with 4 batches in flight once started, or the main process alone."""
    if workers == 0:
        return {"num_workers": 0}
    return {"num_workers": workers, "prefetch_factor": 4}


def pytorch_dataloader(args: argparse.Namespace) -> dict:
    import torch.utils.data

    dataset = parquet_batches_dataset(args)
    return drive(
        lambda: torch.utils.data.DataLoader(dataset, batch_size=None, **loader_options(args.workers)),
        rows_of_tensors,
        args.work_us,
    )


def pytorch_dataloader_naive(args: argparse.Namespace) -> dict:
    import torch.utils.data

    dataset = parquet_rows_dataset(args)
    return drive(
        lambda: torch.utils.data.DataLoader(dataset, batch_size=args.batch_rows, **loader_options(args.workers)),
        rows_of_tensors,
        args.work_us,
    )


def torchdata_loader(args: argparse.Namespace) -> dict:
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset = parquet_batches_dataset(args)
    return drive(
        lambda: StatefulDataLoader(dataset, batch_size=None, **loader_options(args.workers)),
        rows_of_tensors,
        args.work_us,
    )


def spdl_pipeline(args: argparse.Namespace) -> dict:
    """The pipeline a performance-minded user builds with SPDL's ``PipelineBuilder``: the row groups as
    the source, read two at a time on the pipeline's 2 threads (pyarrow releases the GIL while it reads
    and decodes), each into record batches of the trainer's batch size as the DataLoader peers slice
    them; then a row group's batches become dicts of tensors in one task, and only then are they split
    into single batches for the sink, so that a batch costs no hop through the thread pool of its own.
    The trainer iterates the pipeline, whose iterator waits on the sink in slices of 0.1 s and sees the
    end of the data when one runs out: an idle trainer's last request waits up to 0.1 s for it."""
    from spdl.pipeline import PipelineBuilder

    source, columns, batch_rows = args.source, args.columns, args.batch_rows

    def read(group) -> list:
        return list(group.to_batches(batch_size=batch_rows, columns=columns))

    def tensors(record_batches: list) -> list:
        return [to_tensors(batch) for batch in record_batches]

    def batches():
        pipeline = (
            PipelineBuilder()
            .add_source(dataset_row_groups(source))
            .pipe(read, concurrency=2)
            .pipe(tensors)
            .disaggregate()
            .add_sink(3)
            .build(num_threads=2)
        )
        with pipeline.auto_stop():
            yield from pipeline

    return drive(batches, rows_of_tensors, args.work_us)


def convert_to_mds(args: argparse.Namespace) -> Path:
    """The dataset in MDS, written once into ``--scratch``: one sample per record batch, each numeric
    column as one array (floating-point nulls as NaN), so that a sample is a trainer's batch."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from streaming import MDSWriter

    out = Path(args.scratch)
    if (out / SUCCESS_MARKER).exists():
        return out
    dataset = open_dataset(args.source)
    encodings = {}
    for name in args.columns:
        kind = dataset.schema.field(name).type
        encodings[name] = f"ndarray:{kind.to_pandas_dtype().__name__}"
    with MDSWriter(out=str(out), columns=encodings, size_limit=MDS_SHARD_BYTES, exist_ok=True) as writer:
        for batch in dataset.to_batches(batch_size=args.batch_rows, columns=args.columns):
            if batch.num_rows == 0:
                continue
            sample = {}
            for name, column in zip(batch.schema.names, batch.columns):
                if column.null_count and pa.types.is_floating(column.type):
                    column = pc.fill_null(column, math.nan)
                sample[name] = column.to_numpy()
            writer.write(sample)
    (out / SUCCESS_MARKER).write_bytes(b"")
    return out


def mds(args: argparse.Namespace) -> dict:
    out = convert_to_mds(args)
    return {"mds_bytes": sum(path.stat().st_size for path in out.iterdir() if path.is_file())}


def mosaic_streaming(args: argparse.Namespace) -> dict:
    import torch.utils.data
    from streaming import StreamingDataset

    if args.mds_remote:
        # Shards are downloaded from S3 (boto3, at S3_ENDPOINT_URL) into the empty local cache.
        location = {"remote": args.mds_remote, "local": args.scratch}
    else:
        location = {"local": str(convert_to_mds(args))}
    return drive(
        lambda: torch.utils.data.DataLoader(
            StreamingDataset(**location, shuffle=False, batch_size=1),
            batch_size=None,
            **loader_options(args.workers),
        ),
        rows_of_tensors,
        args.work_us,
    )


def ray_data(args: argparse.Namespace) -> dict:
    import ray
    import ray.data

    def batches():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        filesystem, path = filesystem_of(args.source)
        dataset = ray.data.read_parquet(path, filesystem=filesystem, columns=args.columns)
        return dataset.iter_torch_batches(batch_size=args.batch_rows)

    try:
        return drive(batches, rows_of_tensors, args.work_us)
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=("facts", "probe", "mds") + SYSTEMS)
    parser.add_argument("--source", help="the dataset: a Parquet file, a directory of them, or a URI pyarrow reads")
    parser.add_argument("--batch-rows", type=int, default=4096)
    parser.add_argument("--columns", help="the numeric columns, comma-separated, as `facts` printed them")
    parser.add_argument("--work-us", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument(
        "--scratch",
        help="where mosaic_streaming keeps the MDS copy of the dataset, or with --mds-remote its local cache",
    )
    parser.add_argument("--mds-remote", help="the URI of the MDS copy mosaic_streaming reads, e.g. s3://bucket/prefix")
    args = parser.parse_args()
    args.columns = args.columns.split(",") if args.columns else None
    # Ray sends usage statistics unless told not to; nothing of a benchmark leaves the host.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    runs = {
        "facts": lambda: facts(args.source, args.batch_rows),
        "probe": probe,
        "mds": lambda: mds(args),
        "sluice": lambda: sluice_reader(args),
        "sluice_torch": lambda: sluice_torch(args),
        "pyarrow": lambda: pyarrow_scan(args),
        "pytorch_dataloader": lambda: pytorch_dataloader(args),
        "pytorch_dataloader_naive": lambda: pytorch_dataloader_naive(args),
        "torchdata": lambda: torchdata_loader(args),
        "spdl": lambda: spdl_pipeline(args),
        "mosaic_streaming": lambda: mosaic_streaming(args),
        "ray_data": lambda: ray_data(args),
    }
    print(json.dumps(runs[args.system]()), flush=True)


if __name__ == "__main__":
    main()
