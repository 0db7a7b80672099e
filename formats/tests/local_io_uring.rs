//! Local Parquet reads through io_uring and through `pread` give the same rows as reads through
//! `object_store`, for whole files, row ranges and filtered reads that fetch scattered pages.

mod common;

use sluice_formats::generate::{GenerateOptions, generate};
use sluice_formats::uring::{LocalBackend, LocalReader};
use sluice_formats::{Expr, FormatKind, LocalIo, OpenOptions, ReadOptions, StorageOptions};

fn with_io(local_io: LocalIo) -> OpenOptions {
    OpenOptions {
        local_io,
        ..OpenOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_io_uring_and_pread_read_the_same_rows() {
    if let Err(error) = LocalReader::new(LocalIo::Uring) {
        panic!(
            "io_uring is refused on this machine ({error}): this test compares it with pread, so it needs a kernel and seccomp profile that allow io_uring"
        );
    }
    assert_eq!(
        LocalReader::new(LocalIo::Auto).expect("auto").backend(),
        LocalBackend::Uring,
        "auto picks io_uring where it works"
    );
    let directory = tempfile::tempdir().expect("tempdir");
    let generated = directory
        .path()
        .join("generated")
        .to_string_lossy()
        .into_owned();
    let options = GenerateOptions {
        out: generated.clone(),
        rows: 20_000,
        files: 2,
        format: FormatKind::Parquet,
        row_group_rows: 1500,
        seed: 4,
        storage_options: StorageOptions::new(),
    };
    generate(&options, &|_| {}).await.expect("generates");
    let mut sources = vec![generated];
    let testdata = sluice_testkit::testdata();
    for file in [
        "alltypes_tiny_pages.parquet",
        "nested_structs.rust.parquet",
        "nullable.impala.parquet",
        "byte_stream_split.zstd.parquet",
    ] {
        sources.push(
            testdata
                .join("parquet/data")
                .join(file)
                .to_string_lossy()
                .into_owned(),
        );
    }
    let reads = [
        ReadOptions::default(),
        ReadOptions {
            filter: Some(Expr::parse("id in (3, 777, 12001) or id >= 19990").expect("parses")),
            ..ReadOptions::default()
        },
    ];
    for source in &sources {
        for read in &reads {
            if read.filter.is_some()
                && !source.contains("generated")
                && !source.contains("tiny_pages")
            {
                continue;
            }
            let mut outputs = Vec::new();
            for local_io in [LocalIo::Uring, LocalIo::Pread, LocalIo::Auto] {
                let batches = common::read_all(source, &with_io(local_io), read)
                    .await
                    .unwrap_or_else(|error| panic!("{source} ({local_io:?}): {error}"));
                outputs.push(common::jsonl(&batches));
            }
            assert!(!outputs[0].is_empty(), "{source}: some rows");
            assert_eq!(outputs[0], outputs[1], "{source}: io_uring and pread agree");
            assert_eq!(outputs[0], outputs[2], "{source}: auto agrees");
            let object_store = common::read_all(source, &with_io(LocalIo::ObjectStore), read)
                .await
                .expect("store read");
            assert_eq!(
                outputs[0],
                common::jsonl(&object_store),
                "{source}: local reads agree with the object_store path"
            );
        }
    }
}
