//! One suite of journal behaviour (round trips, concurrent appends, snapshots, fencing, identity),
//! run through the public API against a local directory and a real S3 server (SeaweedFS) on
//! 127.0.0.1.

use std::sync::Arc;

use sluice_am::journal::{self, Journal, JournalConfig, JournalError, StorageOptions};
use sluice_testkit::{BUCKET, s3_options, start_seaweed, wait_for_bucket};

/// An entry: (appender, its n-th append).
type Entry = (u32, u32);
/// A snapshot: how many entries it replaces.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Snapshot(u64);

impl journal::SnapshotFormat for Snapshot {}

async fn open(
    uri: &str,
    options: &StorageOptions,
    identity: &str,
) -> journal::Result<(
    Journal<Entry, Snapshot>,
    journal::Recovered<Entry, Snapshot>,
)> {
    journal::open(
        uri,
        options,
        JournalConfig::new(identity).writer("conformance suite"),
    )
    .await
}

async fn suite(uri: &str, options: StorageOptions) {
    let (sut, recovered) = open(uri, &options, "job-1").await.expect("opens");
    assert_eq!(
        (recovered.snapshot, recovered.entries.len()),
        (None, 0),
        "{uri}: a new journal"
    );

    let sut = Arc::new(sut);
    let appenders: Vec<_> = (0..16u32)
        .map(|appender| {
            let sut = Arc::clone(&sut);
            tokio::spawn(async move {
                for round in 0..20u32 {
                    sut.append(&(appender, round)).await.expect("durable");
                }
            })
        })
        .collect();
    for appender in appenders {
        appender.await.expect("appender");
    }
    let stats = sut.stats();
    assert_eq!(stats.entries, 320, "{uri}");
    assert!(
        stats.writes < stats.entries,
        "{uri}: {} writes for {} concurrent entries: appends are not batched",
        stats.writes,
        stats.entries
    );
    Arc::into_inner(sut)
        .expect("the appenders are done")
        .close()
        .await
        .expect("closes");

    let (sut, recovered) = open(uri, &options, "job-1").await.expect("reopens");
    assert_eq!(recovered.entries.len(), 320, "{uri}");
    for appender in 0..16u32 {
        let rounds: Vec<u32> = recovered
            .entries
            .iter()
            .filter(|entry| entry.0 == appender)
            .map(|entry| entry.1)
            .collect();
        assert_eq!(
            rounds,
            (0..20).collect::<Vec<u32>>(),
            "{uri}: appender {appender}"
        );
    }

    sut.snapshot(Snapshot(320)).await.expect("snapshot durable");
    sut.append(&(99, 0)).await.expect("durable");
    sut.close().await.expect("closes");
    let (first, recovered) = open(uri, &options, "job-1").await.expect("reopens");
    assert_eq!(recovered.snapshot, Some(Snapshot(320)), "{uri}");
    assert_eq!(
        recovered.entries,
        vec![(99, 0)],
        "{uri}: the snapshot replaced the rest"
    );

    first.append(&(99, 1)).await.expect("durable");
    let (second, recovered) = open(uri, &options, "job-1")
        .await
        .expect("a second writer opens");
    assert_eq!(recovered.entries, vec![(99, 0), (99, 1)], "{uri}");
    let fenced = first
        .append(&(99, 2))
        .await
        .expect_err("the first writer is fenced");
    assert!(
        matches!(fenced, JournalError::Fenced { .. }),
        "{uri}: {fenced}"
    );
    assert!(fenced.to_string().contains("conformance suite"), "{fenced}");
    second.append(&(99, 3)).await.expect("durable");
    drop(first);

    let refused = open(uri, &options, "job-2").await.expect_err("another job");
    assert!(
        matches!(refused, JournalError::IdentityMismatch { .. }),
        "{uri}: {refused}"
    );
    second
        .append(&(99, 4))
        .await
        .expect("not fenced by the refused opener");
    second.close().await.expect("closes");

    let (_sut, recovered) = open(uri, &options, "job-1").await.expect("reopens");
    assert_eq!(
        recovered.entries,
        vec![(99, 0), (99, 1), (99, 3), (99, 4)],
        "{uri}: the fenced append is not replayed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_suite_on_a_local_directory() {
    let directory = tempfile::tempdir().expect("tempdir");
    suite(
        &format!("file://{}/ckpt/job", directory.path().display()),
        StorageOptions::new(),
    )
    .await;
    let plain = directory.path().join("plain");
    suite(plain.to_str().expect("utf-8"), StorageOptions::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_suite_on_s3() {
    let server = start_seaweed();
    let options = s3_options();
    wait_for_bucket(&server, &options).await;
    suite(&format!("s3://{BUCKET}/ckpt/job"), options).await;
}
