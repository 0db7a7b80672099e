//! Files written by pyarrow in the test, read by Sluice, compared with pyarrow's own rows value for value:
//! nested lists, structs, maps, dictionary strings, nulls in every column, timestamps with time zones,
//! decimals, many row groups, hive partitions, and the row formats (Arrow IPC, CSV, JSON lines, TFRecord).

mod common;

use std::path::Path;

use sluice_formats::{Dataset, Expr, OpenOptions, ReadOptions};

/// Writes the test files (`write DIR`) and compares Sluice's JSON lines with pyarrow (`compare ...`).
const SCRIPT: &str = r#"
import datetime, decimal, json, os, random, struct, sys
import pyarrow as pa, pyarrow.csv as pcsv, pyarrow.dataset as ds, pyarrow.feather as feather, pyarrow.parquet as pq

ROWS = 1000

def nullable(rng, values, rate=0.15):
    return [None if rng.random() < rate else value for value in values]

def table():
    rng = random.Random(42)
    ids = list(range(ROWS))
    utc = datetime.timezone.utc
    base = datetime.datetime(2024, 3, 10, 6, 30, tzinfo=utc)
    point = pa.struct([("x", pa.float64()), ("label", pa.string()), ("tags", pa.list_(pa.int32()))])
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "small": pa.array(nullable(rng, [rng.randint(-128, 127) for _ in ids]), pa.int8()),
        "unsigned": pa.array(nullable(rng, [rng.randint(0, 2**64 - 1) for _ in ids]), pa.uint64()),
        "score": pa.array(nullable(rng, [rng.uniform(-1e6, 1e6) for _ in ids]), pa.float64()),
        "weight": pa.array(nullable(rng, [rng.uniform(0, 1) for _ in ids]), pa.float32()),
        "flag": pa.array(nullable(rng, [rng.random() < 0.5 for _ in ids]), pa.bool_()),
        "name": pa.array(nullable(rng, ["name-%d-\u00e9\u4e2d" % rng.randint(0, 10**6) for _ in ids]), pa.string()),
        "country": pa.array(nullable(rng, [rng.choice(["FR", "DE", "US", "JP"]) for _ in ids])).dictionary_encode(),
        "blob": pa.array(nullable(rng, [bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))) for _ in ids]), pa.binary()),
        "price": pa.array(nullable(rng, [decimal.Decimal(rng.randint(-10**9, 10**9)).scaleb(-4) for _ in ids]), pa.decimal128(18, 4)),
        "day": pa.array(nullable(rng, [datetime.date(2020, 1, 1) + datetime.timedelta(days=rng.randint(0, 2000)) for _ in ids]), pa.date32()),
        "at_utc": pa.array(nullable(rng, [base + datetime.timedelta(microseconds=rng.randint(0, 10**12)) for _ in ids]), pa.timestamp("us", tz="UTC")),
        "at_paris": pa.array(nullable(rng, [base + datetime.timedelta(seconds=rng.randint(0, 10**8)) for _ in ids]), pa.timestamp("ms", tz="Europe/Paris")),
        "at_local": pa.array(nullable(rng, [datetime.datetime(2021, 1, 1) + datetime.timedelta(microseconds=rng.randint(0, 10**13)) for _ in ids]), pa.timestamp("us")),
        "values": pa.array(nullable(rng, [nullable(rng, [rng.uniform(-1, 1) for _ in range(rng.randint(0, 5))], 0.1) for _ in ids]), pa.list_(pa.float32())),
        "nested": pa.array(nullable(rng, [[nullable(rng, [rng.randint(0, 9) for _ in range(rng.randint(0, 3))], 0.2) for _ in range(rng.randint(0, 3))] for _ in ids]), pa.list_(pa.list_(pa.int64()))),
        "point": pa.array(nullable(rng, [{"x": rng.uniform(0, 1) if rng.random() > 0.1 else None, "label": rng.choice(["a", "b", None]), "tags": [rng.randint(0, 5) for _ in range(rng.randint(0, 3))]} for _ in ids]), point),
        "attributes": pa.array(nullable(rng, [[("k%d" % key, nullable(rng, [rng.randint(0, 100)], 0.2)[0]) for key in range(rng.randint(0, 4))] for _ in ids]), pa.map_(pa.string(), pa.int32())),
    })

def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

def write(directory):
    data = table()
    pq.write_table(data, os.path.join(directory, "types.parquet"), row_group_size=37, compression="zstd")
    pq.write_table(data, os.path.join(directory, "types_v2_snappy.parquet"), row_group_size=250, data_page_version="2.0", compression="snappy", use_dictionary=False)
    hive = pa.table({
        "id": pa.array(range(60), pa.int64()),
        "year": pa.array([2020 + i % 3 for i in range(60)], pa.int64()),
        "region": pa.array([["100% north", "south west", None][i % 3 if i % 2 else 0] for i in range(60)], pa.string()),
        "value": pa.array([float(i) / 3 for i in range(60)], pa.float64()),
    })
    pq.write_to_dataset(hive, os.path.join(directory, "hive"), partition_cols=["year", "region"])
    flat = data.select(["id", "small", "score", "flag", "name", "day", "at_utc"])
    feather.write_feather(flat, os.path.join(directory, "flat.arrow"), compression="uncompressed", chunksize=100)
    csv_table = data.select(["id", "small", "score", "flag", "name"])
    pcsv.write_csv(csv_table, os.path.join(directory, "flat.csv"))
    with open(os.path.join(directory, "flat.jsonl"), "w") as out:
        for row in csv_table.to_pylist():
            out.write(json.dumps({key: value for key, value in row.items() if value is not None}) + "\n")
    rng = random.Random(7)
    payloads = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))) for _ in range(200)]
    with open(os.path.join(directory, "records.tfrecord"), "wb") as out:
        for payload in payloads:
            length = struct.pack("<Q", len(payload))
            out.write(length + struct.pack("<I", masked(length)) + payload + struct.pack("<I", masked(payload)))
    with open(os.path.join(directory, "records.expected"), "w") as out:
        for payload in payloads:
            out.write(payload.hex() + "\n")

def f32(value):
    return struct.unpack("<f", struct.pack("<f", float(value)))[0]

def from_sluice(value, kind):
    """A value of Arrow's JSON writer, brought to the canonical form of its Arrow type."""
    if value is None:
        return None
    if pa.types.is_dictionary(kind):
        return from_sluice(value, kind.value_type)
    if pa.types.is_struct(kind):
        return {field.name: from_sluice(value.get(field.name), field.type) for field in kind}
    if pa.types.is_map(kind):
        return sorted((str(key), from_sluice(item, kind.item_type)) for key, item in value.items())
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [from_sluice(item, kind.value_type) for item in value]
    if pa.types.is_timestamp(kind):
        return datetime.datetime.fromisoformat(value)
    if pa.types.is_date(kind):
        return datetime.date.fromisoformat(value)
    if pa.types.is_decimal(kind):
        return decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-kind.scale))
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return bytes.fromhex(value)
    if pa.types.is_float32(kind):
        return f32(value)
    if pa.types.is_floating(kind):
        return float(value)
    if pa.types.is_integer(kind):
        return int(value)
    return value

def from_pyarrow(value, kind):
    """A value of pyarrow's as_py(), brought to the same canonical form."""
    if value is None:
        return None
    if pa.types.is_dictionary(kind):
        return from_pyarrow(value, kind.value_type)
    if pa.types.is_struct(kind):
        return {field.name: from_pyarrow(value.get(field.name), field.type) for field in kind}
    if pa.types.is_map(kind):
        return sorted((str(key), from_pyarrow(item, kind.item_type)) for key, item in value)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [from_pyarrow(item, kind.value_type) for item in value]
    if pa.types.is_float32(kind):
        return f32(value)
    if pa.types.is_decimal(kind):
        return decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-kind.scale))
    return value

def compare(expected_table, actual_path, sort_key):
    with open(actual_path) as handle:
        actual_rows = [json.loads(line, parse_float=decimal.Decimal, parse_int=int) for line in handle if line.strip()]
    schema = expected_table.schema
    expected_rows = expected_table.to_pylist()
    if len(actual_rows) != len(expected_rows):
        sys.exit("row count: sluice %d, pyarrow %d" % (len(actual_rows), len(expected_rows)))
    canonical_actual = [{field.name: from_sluice(row.get(field.name), field.type) for field in schema} for row in actual_rows]
    canonical_expected = [{field.name: from_pyarrow(row.get(field.name), field.type) for field in schema} for row in expected_rows]
    if sort_key:
        canonical_actual.sort(key=lambda row: row[sort_key])
        canonical_expected.sort(key=lambda row: row[sort_key])
    compared = 0
    for index, (actual, expected) in enumerate(zip(canonical_actual, canonical_expected)):
        for field in schema:
            if actual[field.name] != expected[field.name]:
                sys.exit("row %d column %s: sluice %r, pyarrow %r" % (index, field.name, actual[field.name], expected[field.name]))
            compared += 1
    print(compared)

command = sys.argv[1]
if command == "write":
    write(sys.argv[2])
elif command == "compare-parquet":
    compare(pq.read_table(sys.argv[2]), sys.argv[3], None)
elif command == "compare-hive":
    dataset = ds.dataset(sys.argv[2], format="parquet", partitioning="hive")
    compare(dataset.to_table(), sys.argv[3], "id")
elif command == "compare-filtered":
    data = pq.read_table(sys.argv[2])
    import pyarrow.compute as pc
    mask = pc.and_kleene(pc.greater_equal(data["score"], 0), pc.or_kleene(pc.is_in(data["country"], pa.array(["FR", "JP"])), pc.is_null(data["name"])))
    compare(data.filter(mask).select(["id", "country", "name", "score"]), sys.argv[3], None)
elif command == "compare-feather":
    compare(feather.read_table(sys.argv[2]), sys.argv[3], None)
elif command == "compare-csv":
    # The written data has no empty strings: an empty field is a null, as the CSV reader of Sluice reads it.
    compare(pcsv.read_csv(sys.argv[2], convert_options=pcsv.ConvertOptions(strings_can_be_null=True)), sys.argv[3], None)
"#;

async fn read_to_jsonl(uri: &str, options: &ReadOptions, out: &Path) -> usize {
    let batches = common::read_all(uri, &OpenOptions::default(), options)
        .await
        .unwrap_or_else(|error| panic!("{uri}: {error}"));
    std::fs::write(out, common::jsonl(&batches)).expect("write jsonl");
    common::row_count(&batches)
}

fn compared_values(output: &str) -> usize {
    output
        .trim()
        .parse()
        .expect("the comparison prints how many values it compared")
}

fn setup() -> tempfile::TempDir {
    sluice_testkit::require_python_modules("pyarrow");
    let directory = tempfile::tempdir().expect("tempdir");
    common::python(SCRIPT, &["write", &directory.path().to_string_lossy()]);
    directory
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_parquet_values_match_value_for_value() {
    let directory = setup();
    for file in ["types.parquet", "types_v2_snappy.parquet"] {
        let source = directory.path().join(file);
        let actual = directory.path().join(format!("{file}.jsonl"));
        let rows = read_to_jsonl(&source.to_string_lossy(), &ReadOptions::default(), &actual).await;
        assert_eq!(rows, 1000);
        let output = common::python(
            SCRIPT,
            &[
                "compare-parquet",
                &source.to_string_lossy(),
                &actual.to_string_lossy(),
            ],
        );
        assert_eq!(
            compared_values(&output),
            1000 * 18,
            "{file}: every value of every column compared"
        );
    }
    let dataset = Dataset::open(
        &directory.path().join("types.parquet").to_string_lossy(),
        &OpenOptions::default(),
    )
    .await
    .expect("opens");
    assert_eq!(dataset.plan(u64::MAX).await.expect("plan").len(), 1);
    assert_eq!(
        dataset.plan(37).await.expect("plan").len(),
        28,
        "one split per row group of 37 rows"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_filtered_projection_matches_pyarrow_compute() {
    let directory = setup();
    let source = directory.path().join("types.parquet");
    let actual = directory.path().join("filtered.jsonl");
    let options = ReadOptions {
        columns: Some(
            ["id", "country", "name", "score"]
                .map(String::from)
                .to_vec(),
        ),
        filter: Some(
            Expr::parse("score >= 0 and (country in ('FR', 'JP') or name is null)")
                .expect("parses"),
        ),
        batch_rows: 100,
    };
    let rows = read_to_jsonl(&source.to_string_lossy(), &options, &actual).await;
    assert!(rows > 100 && rows < 700, "a selective filter: {rows} rows");
    let output = common::python(
        SCRIPT,
        &[
            "compare-filtered",
            &source.to_string_lossy(),
            &actual.to_string_lossy(),
        ],
    );
    assert_eq!(compared_values(&output), rows * 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_hive_partitions_become_typed_columns() {
    let directory = setup();
    let source = directory.path().join("hive");
    let uri = source.to_string_lossy().into_owned();
    let dataset = Dataset::open(&uri, &OpenOptions::default())
        .await
        .expect("opens");
    let schema = dataset.schema();
    assert_eq!(
        schema.field_with_name("year").expect("year").data_type(),
        &arrow::datatypes::DataType::Int64
    );
    assert_eq!(
        schema
            .field_with_name("region")
            .expect("region")
            .data_type(),
        &arrow::datatypes::DataType::Utf8
    );
    let actual = directory.path().join("hive.jsonl");
    assert_eq!(
        read_to_jsonl(&uri, &ReadOptions::default(), &actual).await,
        60
    );
    let output = common::python(SCRIPT, &["compare-hive", &uri, &actual.to_string_lossy()]);
    assert_eq!(compared_values(&output), 60 * 4);

    let filtered = ReadOptions {
        filter: Some(Expr::parse("year = 2022 and region is null").expect("parses")),
        ..ReadOptions::default()
    };
    let batches = common::read_all(&uri, &OpenOptions::default(), &filtered)
        .await
        .expect("filtered");
    let ids: Vec<i64> = batches
        .iter()
        .flat_map(|batch| {
            let ids = batch
                .column_by_name("id")
                .expect("id")
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .expect("int64")
                .clone();
            ids.values().to_vec()
        })
        .collect();
    let expected: Vec<i64> = (0..60).filter(|id| id % 3 == 2 && id % 2 == 1).collect();
    assert!(!expected.is_empty());
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, expected);

    let glob = format!("{uri}/year=202[01]/*/*.parquet");
    let globbed = Dataset::open(&glob, &OpenOptions::default())
        .await
        .expect("glob");
    let rows: u64 = globbed
        .plan(1000)
        .await
        .expect("plan")
        .iter()
        .map(|split| split.row_count)
        .sum();
    assert_eq!(rows, 40, "the glob selects the years 2020 and 2021");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_row_formats_match_value_for_value() {
    let directory = setup();
    let dir = directory.path();
    let feather_out = dir.join("feather.jsonl");
    assert_eq!(
        read_to_jsonl(
            &dir.join("flat.arrow").to_string_lossy(),
            &ReadOptions::default(),
            &feather_out
        )
        .await,
        1000
    );
    let output = common::python(
        SCRIPT,
        &[
            "compare-feather",
            &dir.join("flat.arrow").to_string_lossy(),
            &feather_out.to_string_lossy(),
        ],
    );
    assert_eq!(compared_values(&output), 1000 * 7);

    let csv_out = dir.join("csv.jsonl");
    assert_eq!(
        read_to_jsonl(
            &dir.join("flat.csv").to_string_lossy(),
            &ReadOptions::default(),
            &csv_out
        )
        .await,
        1000
    );
    let output = common::python(
        SCRIPT,
        &[
            "compare-csv",
            &dir.join("flat.csv").to_string_lossy(),
            &csv_out.to_string_lossy(),
        ],
    );
    assert_eq!(compared_values(&output), 1000 * 5);

    let from_csv = std::fs::read_to_string(&csv_out).expect("csv rows");
    let json_out = dir.join("json.jsonl");
    assert_eq!(
        read_to_jsonl(
            &dir.join("flat.jsonl").to_string_lossy(),
            &ReadOptions::default(),
            &json_out
        )
        .await,
        1000
    );
    let from_json = std::fs::read_to_string(&json_out).expect("json rows");
    let parse = |text: &str| {
        text.lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("json"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        parse(&from_json),
        parse(&from_csv),
        "JSON lines and CSV of the same rows read the same"
    );

    let tfrecord = dir.join("records.tfrecord");
    let dataset = Dataset::open(&tfrecord.to_string_lossy(), &OpenOptions::default())
        .await
        .expect("tfrecord");
    let splits = dataset.plan(64).await.expect("plan");
    assert_eq!(
        splits
            .iter()
            .map(|split| split.row_count)
            .collect::<Vec<_>>(),
        vec![64, 64, 64, 8],
        "200 records cut into pieces of 64 and the rest"
    );
    let mut payloads = Vec::new();
    for split in &splits {
        use futures::TryStreamExt;
        let batches: Vec<arrow::array::RecordBatch> = dataset
            .read_split(split, &ReadOptions::default())
            .await
            .expect("read")
            .try_collect()
            .await
            .expect("decode");
        for batch in batches {
            let records = batch
                .column(0)
                .as_any()
                .downcast_ref::<arrow::array::BinaryArray>()
                .expect("binary")
                .clone();
            payloads.extend(records.iter().map(|record| {
                record
                    .map(|bytes| {
                        bytes
                            .iter()
                            .map(|byte| format!("{byte:02x}"))
                            .collect::<String>()
                    })
                    .unwrap_or_default()
            }));
        }
    }
    let expected: Vec<String> = std::fs::read_to_string(dir.join("records.expected"))
        .expect("expected")
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(
        payloads, expected,
        "every TFRecord payload, in order, across splits"
    );

    let mut corrupt = std::fs::read(&tfrecord).expect("bytes");
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0x40;
    let corrupt_path = dir.join("corrupt.tfrecord");
    std::fs::write(&corrupt_path, corrupt).expect("write");
    let error = common::read_all(
        &corrupt_path.to_string_lossy(),
        &OpenOptions::default(),
        &ReadOptions::default(),
    )
    .await
    .expect_err("crc");
    assert!(
        error.to_string().contains("corrupt.tfrecord")
            && error.to_string().contains("CRC mismatch"),
        "{error}"
    );
}
