"""Iceberg tables written by pyiceberg 0.12 with a SQLite catalog (``iceberg_tables.py``): appends,
copy-on-write deletes, schema evolution, partition evolution, and position and equality delete
files. Every snapshot reads, through ``sluice read``, value for value as pyiceberg scans it; a
snapshot is found by id and by time; a filter on partition columns leaves whole files out of the
plan; a job on two nodes delivers the rows of the filtered table exactly once, through the rings,
as pyiceberg reads them; and the same table written to a real S3 server reads the same, a job of two
epochs through a cache on local disk delivering it once in each."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pyarrow
import pyarrow.compute
import pyarrow.ipc
import pytest

from conftest import S3_BUCKET, WATCHDOG_S, run_example, sluice_run
import iceberg_tables


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    return iceberg_tables.build(tmp_path_factory.mktemp("iceberg"))


def sluice_read(sluice_bin, table: str, *arguments: str, env=None) -> pyarrow.Table:
    """The rows ``sluice read TABLE --output arrow`` prints, as one Arrow table."""
    read = subprocess.run(
        [str(sluice_bin), "read", table, "--output", "arrow", *arguments],
        capture_output=True,
        env=env,
        timeout=WATCHDOG_S,
    )
    assert read.returncode == 0, f"sluice read failed: {read.stderr.decode()[-4000:]}"
    return pyarrow.ipc.open_stream(read.stdout).read_all()


def assert_same_rows(found: pyarrow.Table, expected: pyarrow.Table, what: str) -> None:
    """The same columns, in order, and the same rows by id; pyiceberg's large strings and binaries
    compare as Sluice's Iceberg types (string, binary)."""
    assert found.column_names == expected.column_names, f"{what}: columns"
    found = found.sort_by("id")
    expected = expected.cast(found.schema).sort_by("id")
    assert found.num_rows == expected.num_rows, f"{what}: {found.num_rows} rows, pyiceberg reads {expected.num_rows}"
    for name in found.column_names:
        assert found.column(name).equals(expected.column(name)), f"{what}: column {name} differs"


@pytest.mark.parametrize("name", ["events", "plain"])
def test_every_snapshot_reads_as_pyiceberg_scans_it(sluice_bin, tables, name):
    table = tables["tables"][name]
    for snapshot in table["snapshots"]:
        what = f"{name} at {snapshot['label']} (snapshot {snapshot['snapshot_id']})"
        found = sluice_read(sluice_bin, table["location"], "--version", str(snapshot["snapshot_id"]))
        assert_same_rows(found, snapshot["expected"], what)
    latest = sluice_read(sluice_bin, table["location"])
    assert_same_rows(latest, table["snapshots"][-1]["expected"], f"{name} at its current snapshot")
    by_file = sluice_read(sluice_bin, table["metadata_location"])
    assert_same_rows(by_file, table["snapshots"][-1]["expected"], f"{name} by its metadata file")


def test_the_snapshots_read_with_the_schema_they_were_written_with(sluice_bin, tables):
    snapshots = {snapshot["label"]: snapshot for snapshot in tables["tables"]["events"]["snapshots"]}
    location = tables["tables"]["events"]["location"]
    before = sluice_read(sluice_bin, location, "--version", str(snapshots["append-2"]["snapshot_id"]))
    after = sluice_read(sluice_bin, location, "--version", str(snapshots["evolve-schema"]["snapshot_id"]))
    assert before.schema.field("qty").type == pyarrow.int32()
    assert "name" in before.column_names and "label" not in before.column_names
    assert after.schema.field("qty").type == pyarrow.int64(), "qty was promoted to long"
    assert "label" in after.column_names and "name" not in after.column_names
    # The rows written before the rename keep their values under the new name.
    old = after.filter(pyarrow.compute.less(after.column("id"), 1000)).sort_by("id")
    kept = before.filter(pyarrow.compute.greater_equal(before.column("id"), 50)).sort_by("id")
    assert old.column("label").to_pylist() == kept.column("name").to_pylist()
    assert old.column("score").null_count == old.num_rows, "a column added later is null in older files"


def test_a_snapshot_is_found_by_time(sluice_bin, tables):
    table = tables["tables"]["events"]
    for snapshot in table["snapshots"]:
        found = sluice_read(sluice_bin, table["location"], "--timestamp", str(snapshot["timestamp_ms"]))
        assert_same_rows(found, snapshot["expected"], f"events at the time of {snapshot['label']}")
    first = table["snapshots"][0]["timestamp_ms"]
    early = subprocess.run(
        [str(sluice_bin), "read", table["location"], "--timestamp", str(first - 1)],
        capture_output=True,
        text=True,
        timeout=WATCHDOG_S,
    )
    assert early.returncode != 0
    assert f"no snapshot at or before {first - 1} ms" in early.stderr, early.stderr


def planned_files(sluice_bin, table: str, *arguments: str, env=None) -> set:
    plan = subprocess.run(
        [str(sluice_bin), "plan", table, "--json", *arguments],
        capture_output=True,
        text=True,
        env=env,
        timeout=WATCHDOG_S,
    )
    assert plan.returncode == 0, plan.stderr
    return {split["uri"] for split in json.loads(plan.stdout)}


def test_a_filter_on_partition_columns_leaves_whole_files_out_of_the_plan(sluice_bin, tables):
    table = tables["tables"]["events"]
    expected = table["snapshots"][-1]["expected"]
    every = planned_files(sluice_bin, table["location"])
    by_category = planned_files(sluice_bin, table["location"], "--filter", "category = 'c'")
    assert by_category and by_category < every
    assert all("category=c" in uri for uri in by_category), sorted(by_category)
    filtered = sluice_read(sluice_bin, table["location"], "--filter", "category = 'c'")
    assert_same_rows(filtered, expected.filter(pyarrow.compute.equal(expected.column("category"), "c")), "category = 'c'")

    # A day of `ts`: the files of the day(ts) spec for other days are left out by their partition
    # value, the older files by their bounds of ts, where they have them.
    day = "ts >= '2024-03-07T00:00:00' and ts < '2024-03-08T00:00:00'"
    by_day = planned_files(sluice_bin, table["location"], "--filter", day)
    assert by_day and by_day < every
    assert not any("ts_day=" in uri and "ts_day=2024-03-07" not in uri for uri in by_day), sorted(by_day)
    in_day = sluice_read(sluice_bin, table["location"], "--filter", day)
    start = pyarrow.scalar(1709769600000000, pyarrow.timestamp("us"))
    end = pyarrow.scalar(1709856000000000, pyarrow.timestamp("us"))
    ts = expected.column("ts")
    wanted = expected.filter(pyarrow.compute.and_(pyarrow.compute.greater_equal(ts, start), pyarrow.compute.less(ts, end)))
    assert wanted.num_rows > 0
    assert_same_rows(in_day, wanted, day)


# Each rank reads its ring to the end of every epoch and writes the rows it got in each as one
# Arrow IPC file, or an empty `.none` file for an epoch in which it got none.
TRAINER = r"""
import os, sys
import pyarrow, pyarrow.ipc
import sluice

out, epochs = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["SLUICE_RANK"])
reader = sluice.Reader()
for epoch in range(epochs):
    batches = [batch for batch in reader]
    path = os.path.join(out, f"rank-{rank}-epoch-{epoch}")
    if batches:
        with pyarrow.ipc.new_file(path + ".tmp", batches[0].schema) as file:
            for batch in batches:
                file.write_batch(batch)
        os.replace(path + ".tmp", path + ".arrow")
    else:
        open(path + ".none", "w").close()
"""


def run_job(sluice_bin, tmp_path, source: str, ranks: int, epochs: int = 1, data: str = "", env=None) -> list:
    """Runs a job of ``source`` (a YAML flow mapping) on two nodes with ``ranks`` trainers of
    ``TRAINER``; returns, per epoch, the rows of every rank as one table."""
    out = tmp_path / "out"
    out.mkdir()
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"""
name: iceberg-{os.getpid()}
data:
  sources:
    - {source}
  task_rows: 100
  batch_size: 64
  epochs: {epochs}
{data}
nodes: 2
roles:
  - {{ name: worker, num: {ranks}, command: ["{sys.executable}", "{trainer}", "{out}", "{epochs}"] }}
"""
    )
    sluice_run(sluice_bin, tmp_path, spec, env or os.environ)
    tables = []
    for epoch in range(epochs):
        got = []
        for rank in range(ranks):
            rows = out / f"rank-{rank}-epoch-{epoch}.arrow"
            assert rows.exists() or (out / f"rank-{rank}-epoch-{epoch}.none").exists(), f"rank {rank} did not finish epoch {epoch}"
            if rows.exists():
                got.append(pyarrow.ipc.open_file(rows).read_all())
        tables.append(pyarrow.concat_tables(got))
    return tables


def assert_once(got: pyarrow.Table, expected: pyarrow.Table, what: str) -> None:
    """Every row of ``expected`` in ``got`` once, value for value."""
    counts = collections.Counter(got.column("id").to_pylist())
    assert [id for id, seen in counts.items() if seen > 1] == [], f"{what}: rows delivered twice"
    assert_same_rows(got, expected.select(got.column_names), what)


def test_a_job_on_two_nodes_delivers_the_filtered_table_exactly_once(sluice_bin, tables, tmp_path):
    table = tables["tables"]["events"]
    expected = table["snapshots"][-1]["expected"]
    source = (
        f'{{ uri: "file://{table["location"]}", format: iceberg, filter: "category <> \'a\'", '
        "columns: [id, category, qty, label, ts, score] }"
    )
    [got] = run_job(sluice_bin, tmp_path, source, ranks=3)
    assert_once(got, expected.filter(pyarrow.compute.not_equal(expected.column("category"), "a")), "the job's rows")


def test_a_table_on_s3_reads_as_pyiceberg_scans_it_and_a_job_caches_its_data_files(sluice_bin, s3_server, tmp_path):
    properties = {
        "s3.endpoint": s3_server["AWS_ENDPOINT_URL"],
        "s3.access-key-id": s3_server["AWS_ACCESS_KEY_ID"],
        "s3.secret-access-key": s3_server["AWS_SECRET_ACCESS_KEY"],
        "s3.region": s3_server["AWS_REGION"],
    }
    built = iceberg_tables.build(tmp_path / "catalog", warehouse=f"s3://{S3_BUCKET}/warehouse", properties=properties)
    table = built["tables"]["events"]
    assert table["location"].startswith(f"s3://{S3_BUCKET}/"), table["location"]
    env = dict(os.environ, **s3_server)
    for snapshot in table["snapshots"]:
        found = sluice_read(sluice_bin, table["location"], "--version", str(snapshot["snapshot_id"]), env=env)
        assert_same_rows(found, snapshot["expected"], f"events on S3 at {snapshot['label']}")

    cache = tmp_path / "cache"
    source = f'{{ uri: "{table["location"]}", format: iceberg }}'
    data = f'  cache: {{ dir: "{cache}", max_bytes: 1073741824 }}'
    epochs = run_job(sluice_bin, tmp_path, source, ranks=2, epochs=2, data=data, env=env)
    for epoch, got in enumerate(epochs):
        assert_once(got, table["snapshots"][-1]["expected"], f"epoch {epoch} of the job on S3")
    files = planned_files(sluice_bin, table["location"], env=env)
    entries = [entry for entry in (cache / "blocks").rglob("*") if entry.is_file()]
    assert len(entries) >= len(files), f"{len(entries)} cache entries for {len(files)} data files"


def test_the_iceberg_example_reads_the_table_it_is_given(sluice_bin, tables, tmp_path):
    """``examples/iceberg.yaml``, as its comment runs it, on the evolved table."""
    table = tables["tables"]["events"]
    expected = table["snapshots"][-1]["expected"]
    env = dict(os.environ, SLUICE_ICEBERG=table["location"])
    # Each trainer (`sluice consume`) ends its log with one JSON line.
    lines = run_example(sluice_bin, tmp_path, "iceberg.yaml", env, ranks=2)
    assert len(lines) == 2, lines
    wanted = expected.filter(pyarrow.compute.is_valid(expected.column("score"))).num_rows
    assert sum(line["rows"] for line in lines) == wanted, lines


def test_a_damaged_table_fails_naming_the_file_and_never_panics(sluice_bin, tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    catalog = SqlCatalog("damaged", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=warehouse.as_uri())
    catalog.create_namespace("db")
    rows = pyarrow.table({"id": pyarrow.array(range(100), pyarrow.int64())})
    table = catalog.create_table("db.t", schema=rows.schema)
    table.append(rows)
    location = table.location().removeprefix("file://")
    metadata = table.metadata_location.removeprefix("file://")
    manifest_list = table.current_snapshot().manifest_list.removeprefix("file://")
    data_file = next(iter(table.inspect.files().column("file_path").to_pylist())).removeprefix("file://")

    def refused(path: str, damage, *names: str) -> None:
        original = open(path, "rb").read()
        damage(path, original)
        try:
            read = subprocess.run(
                [str(sluice_bin), "read", location, "--stats"], capture_output=True, text=True, timeout=WATCHDOG_S
            )
        finally:
            open(path, "wb").write(original)
        assert read.returncode != 0, f"a damaged {path} was read"
        assert "panicked" not in read.stderr, read.stderr
        for name in names:
            assert name in read.stderr, read.stderr

    def truncate(path, original):
        open(path, "wb").write(original[: len(original) // 2])

    def garble(path, original):
        open(path, "wb").write(b"\x00" * len(original))

    def remove(path, original):
        os.remove(path)

    refused(metadata, truncate, f"file://{metadata}: metadata file")
    refused(manifest_list, garble, f"manifest list file://{manifest_list}")
    refused(data_file, garble, f"file://{data_file}")
    refused(data_file, remove, f"file://{data_file}")
    # A table with no snapshot yet has nothing to read.
    empty = catalog.create_table("db.empty", schema=rows.schema)
    read = subprocess.run(
        [str(sluice_bin), "read", empty.location().removeprefix("file://")], capture_output=True, text=True, timeout=WATCHDOG_S
    )
    assert read.returncode != 0 and "no data files found" in read.stderr, read.stderr
    # Whole again, it reads.
    read = subprocess.run([str(sluice_bin), "read", location, "--stats"], capture_output=True, text=True, timeout=WATCHDOG_S)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["rows"] == 100
