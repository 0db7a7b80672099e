"""Build small, real Apache Iceberg tables for testing Sluice's Iceberg reader.

``build(root)`` creates a SQLite-backed pyiceberg ``SqlCatalog`` under ``root``
(``root/catalog.db``, warehouse ``root/warehouse``) holding two format-version 2
tables, and returns where they live together with the rows each snapshot is
expected to contain. A reader under test can then be compared, value for value,
with what pyiceberg itself reads.

``db.events`` walks through the features a reader has to get right, one commit
(snapshot) per step:

* ``append-1``, ``append-2``: plain appends into a table partitioned by
  ``identity(category)`` (spec 0), with nulls in optional columns and a null
  partition value.
* ``delete-rows``: ``table.delete("id < 50")``. pyiceberg deletes copy-on-write:
  the affected data files are rewritten without the rows and the originals are
  marked DELETED in the manifests.
* ``evolve-schema``: ``score: double`` added, ``name`` renamed to ``label``,
  ``qty`` promoted from int to long, then an append under the new schema. Older
  files still carry ``name`` and an int32 ``qty``; only field ids tie them to
  the new names and types.
* ``evolve-partition``: ``day(ts)`` added to the spec (spec 1 =
  ``identity(category), day(ts)``; the identity field is kept), then an append
  under spec 1.
* ``position-deletes``: pyiceberg writes no delete files, so this module writes
  two position-delete files itself and commits them through pyiceberg's
  manifest writers and catalog commit: one (spec 0) hits rows in two spec-0
  data files, the other (spec 1) hits rows in an older spec-1 data file and in
  a data file added by the same commit.
* ``equality-deletes``: an equality-delete file on ``id`` under an
  unpartitioned spec (spec 2, registered in the same commit but never made the
  default), so it is global: it removes matching ids from every data file whose
  data sequence number is strictly smaller than its own. The same commit adds a
  data file holding one of the deleted ids, which must survive (equal sequence
  numbers do not match).
* ``append-last``: a plain append after the deletes, again holding a deleted id,
  which must survive.

``db.plain`` is an unpartitioned table appended three times, one data file per
append, covering long, double, string, date, boolean, decimal(10,2) and binary.

Expected rows are pyiceberg's own scan of each snapshot
(``table.scan(snapshot_id=...).to_arrow()``), which projects with the schema
the snapshot was written with. pyiceberg 0.12 refuses to plan scans over
equality-delete files, so for those snapshots the expected rows are computed
here with pyiceberg's planner and reader, then the equality-delete rule; see
``_scan_with_equality_deletes``.

Needs ``pyiceberg[pyarrow,sql-sqlite,pyiceberg-core]`` 0.12 (pyiceberg-core
computes the ``day(ts)`` partition values on write).
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriterV2,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import ManifestGroupPlanner, Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetSnapshotRefUpdate,
    TableUpdate,
)
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
)

CATALOG_NAME = "sluice"
NAMESPACE = "db"
EVENTS = f"{NAMESPACE}.events"
PLAIN = f"{NAMESPACE}.plain"

# Field ids reserved by the Iceberg spec for the columns of a position-delete
# file ("Position Delete Files"): file_path = 2147483546, pos = 2147483545.
POS_DELETE_FILE_PATH_ID = 2147483546
POS_DELETE_POS_ID = 2147483545

# Field ids of db.events. create_table re-assigns ids in schema order, so these
# are the ids the table really has (checked in _create_events).
EVENTS_ID = 1
EVENTS_CATEGORY = 2
EVENTS_QTY = 3
EVENTS_NAME = 4
EVENTS_TS = 5
EVENTS_PRICE = 6

# Partition field ids start at 1000 (spec). day(ts) is added by update_spec and
# gets the next free one.
CATEGORY_PARTITION_FIELD_ID = 1000
# Spec ids: 0 = identity(category) at creation, 1 = + day(ts), 2 = unpartitioned
# (added only to carry the global equality-delete file).
UNPARTITIONED_SPEC_ID = 2

TS_BASE = dt.datetime(2024, 3, 1, 0, 0, 0)
EPOCH_DATE = dt.date(1970, 1, 1)

# ids deleted by the equality-delete file: live rows in many data files of
# every earlier step (both spec-0 files of append-1 as rewritten by delete-rows,
# the category=d and category=null files of append-2, evolve-schema, several
# spec-1 files, the data file added with the position deletes), plus ids that
# are already gone (5: removed by delete-rows; one id removed by the position
# deletes is added at run time) and one that never existed (99999).
EQUALITY_DELETE_IDS = [60, 61, 62, 63, 520, 558, 777, 1234, 1300, 1301, 1600, 1750, 1999, 2510, 5, 99999]
# Re-inserted (must survive): 777 by the equality-delete commit itself (same
# sequence number as the delete), 1234 by append-last (newer).
SAME_COMMIT_REINSERTED_ID = 777
LATER_REINSERTED_ID = 1234


def build(root: Path, warehouse: str | None = None, properties: dict[str, str] | None = None) -> dict[str, Any]:
    """Create the catalog and both tables under ``root``; describe them.

    The tables' files go to ``warehouse`` when given (``s3://bucket/prefix``, with pyiceberg's
    ``properties`` to reach the store: ``s3.endpoint`` and the keys), else to ``root/warehouse``.

    Returns::

        {
          "catalog": {"name": str, "uri": "sqlite:///<root>/catalog.db",
                      "warehouse": "file:///<root>/warehouse"},
          "tables": {
            "events" | "plain": {
              "identifier": "db.events" | "db.plain",
              "location": "<table directory, plain path>",
              "metadata_location": "<current metadata.json, plain path>",
              "snapshots": [
                {"label": str, "snapshot_id": int, "sequence_number": int,
                 "schema_id": int, "timestamp_ms": int,
                 "expected": pyarrow.Table},
                ...  # in commit order
              ],
            },
          },
        }

    ``expected`` uses the schema of its snapshot; rows are in pyiceberg's scan
    order (unsorted).
    """
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if warehouse is None:
        local = root / "warehouse"
        local.mkdir(exist_ok=True)
        warehouse = local.as_uri()
    uri = f"sqlite:///{root / 'catalog.db'}"
    catalog = SqlCatalog(CATALOG_NAME, uri=uri, warehouse=warehouse, **(properties or {}))
    catalog.create_namespace(NAMESPACE)

    events_labels = _build_events(catalog)
    plain_labels = _build_plain(catalog)
    return {
        "catalog": {"name": CATALOG_NAME, "uri": uri, "warehouse": warehouse},
        "tables": {
            "events": _describe(catalog.load_table(EVENTS), events_labels),
            "plain": _describe(catalog.load_table(PLAIN), plain_labels),
        },
    }


# --------------------------------------------------------------------------
# db.events


def _events_schema() -> Schema:
    return Schema(
        NestedField(EVENTS_ID, "id", LongType(), required=True),
        NestedField(EVENTS_CATEGORY, "category", StringType(), required=False),
        NestedField(EVENTS_QTY, "qty", IntegerType(), required=False),
        NestedField(EVENTS_NAME, "name", StringType(), required=False),
        NestedField(EVENTS_TS, "ts", TimestampType(), required=False),
        NestedField(EVENTS_PRICE, "price", DoubleType(), required=False),
    )


def _ts(i: int) -> dt.datetime | None:
    # ~1.8 days per 500 ids, with a microsecond part; a few nulls.
    if i % 97 == 5:
        return None
    return TS_BASE + dt.timedelta(seconds=i * 311, microseconds=(i * 7919) % 1_000_000)


def _events_rows(
    table: Table,
    ids: list[int],
    categories: list[str | None],
    ts: Callable[[int], dt.datetime | None] = _ts,
) -> pa.Table:
    """Rows for ``ids`` in the table's current schema (before or after evolution)."""
    names = {f.name for f in table.schema().fields}
    cols: dict[str, list[Any]] = {
        "id": ids,
        "category": [categories[k % len(categories)] for k in range(len(ids))],
        "qty": [None if i % 17 == 0 else (i * 7) % 1000 - 300 for i in ids],
        "ts": [ts(i) for i in ids],
        "price": [None if i % 13 == 0 else round(i * 1.25 - 99.5, 2) for i in ids],
    }
    text = [None if i % 11 == 0 else f"item-{i:05d}" for i in ids]
    if "label" in names:  # after evolve-schema
        cols["label"] = text
        cols["score"] = [None if i % 19 == 0 else i / 8.0 for i in ids]
    else:
        cols["name"] = text
    return pa.Table.from_pydict(cols, schema=table.schema().as_arrow())


def _create_events(catalog: SqlCatalog) -> Table:
    spec = PartitionSpec(
        PartitionField(
            source_id=EVENTS_CATEGORY,
            field_id=CATEGORY_PARTITION_FIELD_ID,
            transform=IdentityTransform(),
            name="category",
        ),
        spec_id=0,
    )
    table = catalog.create_table(
        EVENTS,
        schema=_events_schema(),
        partition_spec=spec,
        properties={TableProperties.FORMAT_VERSION: "2"},
    )
    got = {f.name: f.field_id for f in table.schema().fields}
    want = {f.name: f.field_id for f in _events_schema().fields}
    if got != want:
        raise RuntimeError(f"unexpected field ids after create_table: {got}")
    return table


def _build_events(catalog: SqlCatalog) -> list[tuple[str, int]]:
    table = _create_events(catalog)
    labels: list[tuple[str, int]] = []

    def record(label: str) -> None:
        nonlocal table
        table = catalog.load_table(EVENTS)
        labels.append((label, table.current_snapshot().snapshot_id))

    # Spec 0: one file per category value, including category=null.
    table.append(_events_rows(table, list(range(0, 500)), ["a", "b"]))
    record("append-1")
    table.append(_events_rows(table, list(range(500, 1000)), ["b", "c", "d", None, "c"]))
    record("append-2")

    # Copy-on-write: both append-1 files are partly matched, so pyiceberg
    # writes one overwrite snapshot that replaces them.
    before = len(table.snapshots())
    table.delete("id < 50")
    record("delete-rows")
    if len(table.snapshots()) != before + 1:
        raise RuntimeError("table.delete produced more than one snapshot")

    with table.update_schema() as update:
        update.add_column("score", DoubleType())
        update.rename_column("name", "label")
        update.update_column("qty", LongType())
    table = catalog.load_table(EVENTS)
    table.append(_events_rows(table, list(range(1000, 1500)), ["a", "c"]))
    record("evolve-schema")

    with table.update_spec() as update:
        update.add_field("ts", DayTransform(), "ts_day")
    table = catalog.load_table(EVENTS)
    table.append(_events_rows(table, list(range(1500, 2000)), ["a", "b"]))
    record("evolve-partition")

    pos_deleted_id = _commit_position_deletes(catalog, table)
    record("position-deletes")

    _commit_equality_deletes(catalog, table, extra_ids=[pos_deleted_id])
    record("equality-deletes")

    table.append(_events_rows(table, list(range(2000, 2100)) + [LATER_REINSERTED_ID], ["b", "d"]))
    record("append-last")
    return labels


def _live_entries(table: Table) -> list[ManifestEntry]:
    """Live manifest entries of the current snapshot (data and delete files)."""
    return [
        entry
        for manifest in table.current_snapshot().manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def _ids_at(table: Table, file_path: str, positions: list[int]) -> list[int]:
    with table.io.new_input(file_path).open() as f:
        ids = pq.read_table(f, columns=["id"]).column("id").to_pylist()
    return [ids[p] for p in positions]


def _commit_position_deletes(catalog: SqlCatalog, table: Table) -> int:
    """Commit two position-delete files (and one data file); return one deleted id.

    Delete file A (spec 0, partition category='a') removes rows of the two
    spec-0 data files in that partition: the append-1 file rewritten by
    delete-rows and the evolve-schema file. Delete file B (spec 1) removes rows
    of the largest evolve-partition file and of a new data file added by this
    same commit to B's partition. A position delete applies to data files whose
    data sequence number is <= its own, so it hits that new file too.
    """
    data = [e for e in _live_entries(table) if e.data_file.content == DataFileContent.DATA]
    spec0_a = sorted(
        (e for e in data if e.data_file.spec_id == 0 and e.data_file.partition == Record("a")),
        key=lambda e: e.sequence_number,
    )
    if len(spec0_a) != 2:
        raise RuntimeError(f"expected 2 live spec-0 files in category=a, found {len(spec0_a)}")
    spec1 = max((e for e in data if e.data_file.spec_id == 1), key=lambda e: e.data_file.record_count)
    category, day = spec1.data_file.partition[0], spec1.data_file.partition[1]

    # The new data file: 20 rows in B's partition (same category and day).
    day_start = dt.datetime.combine(EPOCH_DATE + dt.timedelta(days=day), dt.time())
    new_rows = _events_rows(
        table, list(range(2500, 2520)), [category], ts=lambda i: day_start + dt.timedelta(minutes=i - 2500, microseconds=i)
    )
    commit_uuid = uuid.uuid4()
    new_files = list(_dataframe_to_data_files(table.metadata, new_rows, table.io, write_uuid=commit_uuid))
    if len(new_files) != 1 or new_files[0].partition != spec1.data_file.partition:
        raise RuntimeError("the new data file did not land in the targeted spec-1 partition")
    for f in new_files:
        f.spec_id = table.metadata.default_spec_id

    targets_a = {spec0_a[0].data_file.file_path: [0, 1, 10], spec0_a[1].data_file.file_path: [5, 6, 7, 200]}
    targets_b = {spec1.data_file.file_path: [0, 3], new_files[0].file_path: [2, 4]}
    delete_a = _write_position_delete_file(table, targets_a, spec0_a[0].data_file)
    delete_b = _write_position_delete_file(table, targets_b, spec1.data_file)

    removed = [i for path, pos in {**targets_a, **targets_b}.items() for i in _ids_at(table, path, pos)]
    _commit_files(
        catalog,
        table,
        data_files=new_files,
        delete_files=[delete_a, delete_b],
        operation=Operation.OVERWRITE,
        commit_uuid=commit_uuid,
    )
    kept = [i for i in range(2500, 2520) if i not in removed]
    _check_rows(catalog.load_table(EVENTS), removed=removed, present=kept, what="position deletes")
    return removed[0]


def _write_position_delete_file(table: Table, targets: dict[str, list[int]], like: DataFile) -> DataFile:
    """Write a position-delete Parquet file and describe it as a DataFile.

    ``targets`` maps data file paths, exactly as the manifests spell them, to
    0-based row positions. The file takes the spec id and partition of
    ``like``: a position delete is only matched against data files of the same
    spec and partition.
    """
    rows = sorted((path, pos) for path, positions in targets.items() for pos in positions)  # spec: sorted by path, pos
    arrow_schema = pa.schema(
        [
            pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": str(POS_DELETE_FILE_PATH_ID)}),
            pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_DELETE_POS_ID)}),
        ]
    )
    content = pa.Table.from_pylist([{"file_path": p, "pos": n} for p, n in rows], schema=arrow_schema)
    return _write_delete_file(
        table, content, DataFileContent.POSITION_DELETES, like.spec_id, like.partition, equality_ids=None
    )


def _commit_equality_deletes(catalog: SqlCatalog, table: Table, extra_ids: list[int]) -> None:
    """Commit a global equality-delete file on ``id`` plus one data file.

    The delete file uses an unpartitioned spec so that it applies to data files
    of every partition and spec. The table has no unpartitioned spec, so one
    (spec 2) is added by this commit without becoming the default: writes stay
    on spec 1. Per the spec, an equality delete applies to a data file only if
    the data file's data sequence number is strictly smaller than the delete's,
    so the row with id 777 in the data file added by this same commit survives.
    """
    unpartitioned = PartitionSpec(spec_id=UNPARTITIONED_SPEC_ID)
    if UNPARTITIONED_SPEC_ID in table.metadata.specs():
        raise RuntimeError(f"spec id {UNPARTITIONED_SPEC_ID} already taken")

    ids = EQUALITY_DELETE_IDS + extra_ids
    id_field = table.schema().find_field("id")
    delete_schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(id_field.field_id)})]
    )
    content = pa.Table.from_pydict({"id": ids}, schema=delete_schema)
    delete = _write_delete_file(
        table,
        content,
        DataFileContent.EQUALITY_DELETES,
        UNPARTITIONED_SPEC_ID,
        Record(),
        equality_ids=[id_field.field_id],
    )

    commit_uuid = uuid.uuid4()
    rows = _events_rows(table, list(range(3000, 3005)) + [SAME_COMMIT_REINSERTED_ID], ["c"])
    new_files = list(_dataframe_to_data_files(table.metadata, rows, table.io, write_uuid=commit_uuid))
    for f in new_files:
        f.spec_id = table.metadata.default_spec_id

    _commit_files(
        catalog,
        table,
        data_files=new_files,
        delete_files=[delete],
        operation=Operation.OVERWRITE,
        commit_uuid=commit_uuid,
        extra_specs={UNPARTITIONED_SPEC_ID: unpartitioned},
        extra_updates=(AddPartitionSpecUpdate(spec=unpartitioned),),
    )
    removed = [i for i in ids if i != SAME_COMMIT_REINSERTED_ID]
    _check_rows(catalog.load_table(EVENTS), removed=removed, present=[SAME_COMMIT_REINSERTED_ID], what="equality deletes")


def _write_delete_file(
    table: Table,
    content: pa.Table,
    kind: DataFileContent,
    spec_id: int,
    partition: Record,
    equality_ids: list[int] | None,
) -> DataFile:
    name = f"{uuid.uuid4()}-{'pos' if kind == DataFileContent.POSITION_DELETES else 'eq'}-deletes.parquet"
    path = table.location_provider().new_data_location(name)
    with table.io.new_output(path).create() as out:
        pq.write_table(content, out, compression="zstd")
    delete = DataFile.from_args(
        content=kind,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=content.num_rows,
        file_size_in_bytes=len(table.io.new_input(path)),
        # No column metrics: they are optional, and readers must cope without.
        equality_ids=equality_ids,
        sort_order_id=None,
        key_metadata=None,
    )
    delete.spec_id = spec_id  # not stored in the file; inherited from the manifest on read
    return delete


def _check_rows(table: Table, removed: list[int], present: list[int], what: str) -> None:
    """Fail loudly if a delete commit did not do what it was meant to."""
    ids = _scan_snapshot(table, table.current_snapshot().snapshot_id).column("id").to_pylist()
    if len(ids) != len(set(ids)):
        raise RuntimeError(f"{what}: duplicate ids after the commit")
    still_there = sorted(set(removed) & set(ids))
    missing = sorted(set(present) - set(ids))
    if still_there or missing:
        raise RuntimeError(f"{what}: ids not removed {still_there}, ids missing {missing}")


# --------------------------------------------------------------------------
# Committing delete files through pyiceberg's manifest writers


class _DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg 0.12's v2 manifest writer, labelled as a delete manifest.

    ``ManifestWriterV2`` always reports content DATA (in the manifest-list entry
    it produces and in the Avro header's ``content`` key); delete files must be
    listed in a manifest whose content is DELETES.
    """

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def _commit_files(
    catalog: SqlCatalog,
    table: Table,
    *,
    data_files: list[DataFile],
    delete_files: list[DataFile],
    operation: Operation,
    commit_uuid: uuid.UUID,
    extra_specs: dict[int, PartitionSpec] | None = None,
    extra_updates: tuple[TableUpdate, ...] = (),
) -> None:
    """Commit one snapshot adding ``data_files`` and ``delete_files`` on main.

    Mirrors ``_SnapshotProducer._commit`` in pyiceberg 0.12: new manifests (one
    per spec and content) followed by every manifest of the parent snapshot in
    a new manifest list, a snapshot with sequence number last + 1, and a commit
    guarded by ``AssertRefSnapshotId`` on main. Entries are written with a null
    sequence number and status ADDED, so they inherit the snapshot's sequence
    number from the manifest list on read (spec: sequence number inheritance).
    """
    metadata = table.metadata
    if metadata.format_version != 2:
        raise RuntimeError("delete files need a format-version 2 table")
    specs = {**metadata.specs(), **(extra_specs or {})}
    schema = metadata.schema()
    parent = metadata.current_snapshot()
    snapshot_id = metadata.new_snapshot_id()
    sequence_number = metadata.next_sequence_number()
    codec = metadata.properties.get(TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
    locations = table.location_provider()
    counter = itertools.count()

    new_manifests = []
    for files, writer_class in ((data_files, None), (delete_files, _DeleteManifestWriter)):
        for spec_id in sorted({f.spec_id for f in files}):
            output = table.io.new_output(locations.new_metadata_location(f"{commit_uuid}-m{next(counter)}.avro"))
            if writer_class is None:
                writer = write_manifest(2, specs[spec_id], schema, output, snapshot_id, codec)
            else:
                writer = writer_class(specs[spec_id], schema, output, snapshot_id, codec)
            with writer:
                for f in files:
                    if f.spec_id == spec_id:
                        writer.add(
                            ManifestEntry.from_args(
                                status=ManifestEntryStatus.ADDED,
                                snapshot_id=snapshot_id,
                                sequence_number=None,
                                file_sequence_number=None,
                                data_file=f,
                            )
                        )
            new_manifests.append(writer.to_manifest_file())

    manifest_list = locations.new_metadata_location(f"snap-{snapshot_id}-0-{commit_uuid}.avro")
    with write_manifest_list(
        format_version=2,
        output_file=table.io.new_output(manifest_list),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=sequence_number,
        avro_compression=codec,
    ) as writer:
        writer.add_manifests(new_manifests + list(parent.manifests(table.io)))

    collector = SnapshotSummaryCollector()
    for f in data_files + delete_files:
        collector.add_file(f, schema=schema, partition_spec=specs[f.spec_id])
    summary = update_snapshot_summaries(Summary(operation=operation, **collector.build()), parent.summary)

    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=sequence_number,
        manifest_list=manifest_list,
        summary=summary,
        schema_id=metadata.current_schema_id,
    )
    updates = (
        *extra_updates,
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent.snapshot_id,
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
        ),
    )
    requirements = (AssertRefSnapshotId(snapshot_id=parent.snapshot_id, ref=MAIN_BRANCH),)
    catalog.commit_table(table, requirements, updates)


# --------------------------------------------------------------------------
# db.plain


def _plain_schema() -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "x", DoubleType(), required=False),
        NestedField(3, "tag", StringType(), required=False),
        NestedField(4, "day", DateType(), required=False),
        NestedField(5, "flag", BooleanType(), required=False),
        NestedField(6, "amount", DecimalType(10, 2), required=False),
        NestedField(7, "blob", BinaryType(), required=False),
    )


def _plain_rows(table: Table, ids: list[int]) -> pa.Table:
    cols = {
        "id": ids,
        "x": [None if i % 23 == 0 else (i - 400) * 0.375 for i in ids],
        "tag": [None if i % 29 == 0 else ("" if i % 31 == 0 else f"tag-{i % 7}-\u00e9") for i in ids],
        # Dates on both sides of the epoch.
        "day": [None if i % 37 == 0 else dt.date(1969, 12, 1) + dt.timedelta(days=i * 3) for i in ids],
        "flag": [None if i % 41 == 0 else i % 3 == 0 for i in ids],
        "amount": [None if i % 43 == 0 else Decimal(((i * 7919) % 2_000_001) - 1_000_000).scaleb(-2) for i in ids],
        "blob": [None if i % 47 == 0 else bytes((i + k) % 256 for k in range(i % 9)) for i in ids],
    }
    return pa.Table.from_pydict(cols, schema=table.schema().as_arrow())


def _build_plain(catalog: SqlCatalog) -> list[tuple[str, int]]:
    table = catalog.create_table(PLAIN, schema=_plain_schema(), properties={TableProperties.FORMAT_VERSION: "2"})
    labels = []
    for n, (start, stop) in enumerate([(0, 300), (300, 650), (650, 900)], start=1):
        table.append(_plain_rows(table, list(range(start, stop))))
        table = catalog.load_table(PLAIN)
        labels.append((f"append-{n}", table.current_snapshot().snapshot_id))
    return labels


# --------------------------------------------------------------------------
# Expected rows


def _scan_snapshot(table: Table, snapshot_id: int) -> pa.Table:
    """Rows of a snapshot as pyiceberg reads them, with equality deletes applied.

    Without equality-delete files this is exactly
    ``table.scan(snapshot_id=...).to_arrow()``, which projects with the
    snapshot's own schema. pyiceberg 0.12 raises while planning a scan that
    meets an equality-delete file; those snapshots go through
    ``_scan_with_equality_deletes``.
    """
    snapshot = table.snapshot_by_id(snapshot_id)
    has_equality_deletes = any(
        entry.data_file.content == DataFileContent.EQUALITY_DELETES
        for manifest in snapshot.manifests(table.io)
        if manifest.content == ManifestContent.DELETES
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    )
    if has_equality_deletes:
        return _scan_with_equality_deletes(table, snapshot_id)
    return table.scan(snapshot_id=snapshot_id).to_arrow()


def _scan_with_equality_deletes(table: Table, snapshot_id: int) -> pa.Table:
    """pyiceberg's scan of a snapshot, plus the equality-delete rule.

    The rows are: pyiceberg's own plan of the snapshot with the
    equality-delete entries filtered out (so each data file comes with the
    position deletes that apply to it), each task read with pyiceberg's
    ``ArrowScan`` under the snapshot's schema, in plan order; then, for every
    equality-delete file, the rows whose equality columns equal a row of the
    delete file (null equals null) are dropped from each data file it applies
    to. Per the spec it applies when the data file's data sequence number is
    strictly smaller than the delete's, and the delete's spec is unpartitioned
    or has the data file's spec id and partition value. Without
    equality-delete files this returns the same table as ``to_arrow()``.
    """
    scan = table.scan(snapshot_id=snapshot_id)
    schema = scan.projection()
    manifests = table.snapshot_by_id(snapshot_id).manifests(table.io)
    entries = [e for m in manifests for e in m.fetch_manifest_entry(table.io, discard_deleted=True)]
    data_seq = {e.data_file.file_path: e.sequence_number for e in entries if e.data_file.content == DataFileContent.DATA}
    eq_deletes = [
        (e, _read_equality_keys(table, e.data_file, schema))
        for e in entries
        if e.data_file.content == DataFileContent.EQUALITY_DELETES
    ]
    specs = table.metadata.specs()

    planner = ManifestGroupPlanner(table_metadata=table.metadata, io=table.io)
    tasks = planner.plan_files(
        manifests, manifest_entry_filter=lambda e: e.data_file.content != DataFileContent.EQUALITY_DELETES
    )
    reader = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
    pieces = []
    for task in tasks:
        rows = reader.to_table([task])
        for entry, (names, keys) in eq_deletes:
            delete = entry.data_file
            if data_seq[task.file.file_path] >= entry.sequence_number:
                continue
            if not specs[delete.spec_id].is_unpartitioned() and (
                delete.spec_id != task.file.spec_id or delete.partition != task.file.partition
            ):
                continue
            row_keys = zip(*(rows.column(n).to_pylist() for n in names))
            rows = rows.filter(pa.array([k not in keys for k in row_keys], type=pa.bool_()))
        pieces.append(rows)
    if not pieces:
        return reader.to_table([])
    return pa.concat_tables(pieces)


def _read_equality_keys(table: Table, delete: DataFile, schema: Schema) -> tuple[list[str], set[tuple[Any, ...]]]:
    """Column names (in ``schema``) and the set of key tuples of an equality-delete file.

    Delete-file columns are matched to the equality ids through their Parquet
    field ids, not their names.
    """
    with table.io.new_input(delete.file_path).open() as f:
        content = pq.read_table(f)
    by_id = {
        int(field.metadata[b"PARQUET:field_id"]): field.name
        for field in content.schema
        if field.metadata and b"PARQUET:field_id" in field.metadata
    }
    columns = [content.column(by_id[fid]).to_pylist() for fid in delete.equality_ids]
    names = [schema.find_column_name(fid) for fid in delete.equality_ids]
    return names, set(zip(*columns))


def _describe(table: Table, labels: list[tuple[str, int]]) -> dict[str, Any]:
    snapshots = []
    for label, snapshot_id in labels:
        snapshot = table.snapshot_by_id(snapshot_id)
        snapshots.append(
            {
                "label": label,
                "snapshot_id": snapshot_id,
                "sequence_number": snapshot.sequence_number,
                "schema_id": snapshot.schema_id,
                "timestamp_ms": snapshot.timestamp_ms,
                "expected": _scan_snapshot(table, snapshot_id),
            }
        )
    return {
        "identifier": ".".join(table.name()),
        "location": _to_path(table.location()),
        "metadata_location": _to_path(table.metadata_location),
        "snapshots": snapshots,
    }


def _to_path(location: str) -> str:
    parsed = urlparse(location)
    return unquote(parsed.path) if parsed.scheme == "file" else location
