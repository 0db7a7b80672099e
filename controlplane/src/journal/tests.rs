//! The journal's behaviour on a local directory and on an object store (in memory), including the
//! damage a crash or a lost object leaves behind.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use serde::{Deserialize, Serialize};

use super::frame::{FRAME_HEADER, parse_segment, push_frame};
use super::recover::Listing;
use super::store::{ObjectPrefix, segment_name, snapshot_name};
use super::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    number: u64,
    note: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Count {
    through: u64,
}

impl SnapshotFormat for Count {}

fn entry(number: u64) -> Entry {
    Entry {
        number,
        note: format!("entry {number}"),
    }
}

fn entries(range: std::ops::Range<u64>) -> Vec<Entry> {
    range.map(entry).collect()
}

struct Fixture {
    name: &'static str,
    store: Store,
    _directory: Option<tempfile::TempDir>,
    /// The object store, to count its puts.
    remote: Option<Arc<RemoteLike>>,
}

fn local() -> Fixture {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("ckpt");
    let store = Store::open(path.to_str().expect("utf-8"), &StorageOptions::new()).expect("local");
    Fixture {
        name: "local directory",
        store,
        _directory: Some(directory),
        remote: None,
    }
}

/// An in-memory object store whose puts take a while, like a remote store's, and are counted.
#[derive(Debug, Default)]
struct RemoteLike {
    inner: InMemory,
    puts: AtomicU64,
    /// Whether it overwrites an object a put asked to create only if absent, as some S3-compatible
    /// servers do.
    overwrites: bool,
    /// How many of the next puts fail as a client out of file descriptors fails to connect.
    descriptor_shortages: AtomicU64,
}

impl fmt::Display for RemoteLike {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "RemoteLike({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for RemoteLike {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        options: PutOptions,
    ) -> object_store::Result<PutResult> {
        // Relaxed: a statistic, read after the writes it counts were awaited.
        self.puts.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let short = self
            .descriptor_shortages
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if short {
            return Err(object_store::Error::Generic {
                store: "RemoteLike",
                source: Box::new(std::io::Error::from_raw_os_error(libc::EMFILE)),
            });
        }
        let options = if self.overwrites {
            PutOptions::from(PutMode::Overwrite)
        } else {
            options
        };
        self.inner.put_opts(location, payload, options).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        options: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, options).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn memory() -> Fixture {
    let remote = Arc::new(RemoteLike::default());
    let prefix = ObjectPrefix::new(remote.clone(), "jobs/one", "memory:///jobs/one");
    Fixture {
        name: "object store",
        store: Store::Object(Arc::new(prefix)),
        _directory: None,
        remote: Some(remote),
    }
}

fn fixtures() -> [Fixture; 2] {
    [local(), memory()]
}

type TestJournal = Journal<Entry, Count>;

/// Opens with no write interval: these tests are about what each write holds.
async fn open_as(store: &Store, identity: &str) -> Result<(TestJournal, Recovered<Entry, Count>)> {
    open_store(
        store.clone(),
        JournalConfig::new(identity).write_interval(Duration::ZERO),
    )
    .await
}

async fn reopen(store: &Store) -> (TestJournal, Recovered<Entry, Count>) {
    open_as(store, "job-1").await.expect("opens")
}

async fn append_all(journal: &TestJournal, range: std::ops::Range<u64>) {
    let durables: Vec<Durable> = range.map(|number| journal.append(&entry(number))).collect();
    for durable in durables {
        durable.await.expect("durable");
    }
}

/// The largest segment: the one holding the entries.
async fn largest_segment(store: &Store) -> (String, Vec<u8>) {
    let listing = Listing::read(store).await.expect("lists");
    let mut largest = (String::new(), Vec::new());
    for first in listing.segments {
        let name = segment_name(first);
        let bytes = store.read(&name).await.expect("reads").expect("exists");
        if bytes.len() > largest.1.len() {
            largest = (name, bytes.to_vec());
        }
    }
    largest
}

/// The last segment of the journal, where a torn write can only be.
async fn last_segment(store: &Store) -> (String, Vec<u8>) {
    let listing = Listing::read(store).await.expect("lists");
    let name = segment_name(*listing.segments.last().expect("a segment"));
    let bytes = store.read(&name).await.expect("reads").expect("exists");
    (name, bytes.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_round_trip_across_reopens() {
    for fixture in fixtures() {
        let (sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(
            recovered,
            Recovered {
                snapshot: None,
                entries: Vec::new(),
                discarded_bytes: 0
            },
            "{}",
            fixture.name
        );
        append_all(&sut, 0..100).await;
        sut.close().await.expect("closes");
        let (sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(recovered.entries, entries(0..100), "{}", fixture.name);
        append_all(&sut, 100..150).await;
        drop(sut);
        let (_sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(recovered.entries, entries(0..150), "{}", fixture.name);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn appends_queued_during_a_write_share_the_next_write() {
    for fixture in fixtures() {
        let (sut, _) = reopen(&fixture.store).await;
        let puts_before = fixture
            .remote
            .as_ref()
            .map(|remote| remote.puts.load(Ordering::Relaxed));
        let first = sut.append(&entry(0));
        // The writer task runs now (one thread): it takes the one queued entry and starts its
        // write. It cannot run again before this task awaits, so the next 999 appends queue up.
        tokio::task::yield_now().await;
        let rest: Vec<Durable> = (1..1000).map(|number| sut.append(&entry(number))).collect();
        first.await.expect("durable");
        for durable in rest {
            durable.await.expect("durable");
        }
        let stats = sut.stats();
        assert_eq!((stats.writes, stats.entries), (2, 1000), "{}", fixture.name);
        if let (Some(remote), Some(before)) = (&fixture.remote, puts_before) {
            assert_eq!(remote.puts.load(Ordering::Relaxed) - before, 2, "two puts");
            let listing = Listing::read(&fixture.store).await.expect("lists");
            assert_eq!(listing.segments.len(), 3, "the open record and two batches");
        }
        sut.close().await.expect("closes");
        let (_sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(recovered.entries, entries(0..1000), "{}", fixture.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_appenders_share_writes() {
    for fixture in fixtures() {
        let (sut, _) = reopen(&fixture.store).await;
        let sut = Arc::new(sut);
        let appenders: Vec<_> = (0..64u64)
            .map(|appender| {
                let sut = Arc::clone(&sut);
                tokio::spawn(async move {
                    for round in 0..50 {
                        sut.append(&entry(appender * 1000 + round))
                            .await
                            .expect("durable");
                    }
                })
            })
            .collect();
        for appender in appenders {
            appender.await.expect("appender");
        }
        let stats = sut.stats();
        assert_eq!(stats.entries, 3200, "{}", fixture.name);
        if let Some(remote) = &fixture.remote {
            let puts = remote.puts.load(Ordering::Relaxed);
            assert_eq!(
                puts,
                stats.writes + 4,
                "the create-if-absent probe's two puts, the identity, the open record, and the batches"
            );
        }
        assert!(
            stats.writes * 4 <= stats.entries,
            "{}: {} writes for {} entries: appends are not batched",
            fixture.name,
            stats.writes,
            stats.entries
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_interval_bounds_the_writes() {
    let interval = Duration::from_millis(20);
    for fixture in fixtures() {
        let config = JournalConfig::new("job-1").write_interval(interval);
        let (sut, _) = open_store::<Entry, Count>(fixture.store.clone(), config)
            .await
            .expect("opens");
        let sut = Arc::new(sut);
        let started = std::time::Instant::now();
        let appenders: Vec<_> = (0..32u64)
            .map(|appender| {
                let sut = Arc::clone(&sut);
                tokio::spawn(async move {
                    for round in 0..10 {
                        sut.append(&entry(appender * 1000 + round))
                            .await
                            .expect("durable");
                    }
                })
            })
            .collect();
        for appender in appenders {
            appender.await.expect("appender");
        }
        let elapsed = started.elapsed();
        let stats = sut.stats();
        assert_eq!(stats.entries, 320, "{}", fixture.name);
        // Writes start at least `interval` apart, and the last one started within `elapsed`.
        let bound = (elapsed.as_millis() / interval.as_millis()) as u64 + 1;
        assert!(
            stats.writes <= bound,
            "{}: {} writes in {elapsed:?}, at most {bound} allowed",
            fixture.name,
            stats.writes
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_replaces_the_entries_before_it() {
    for fixture in fixtures() {
        let (sut, _) = reopen(&fixture.store).await;
        append_all(&sut, 0..10).await;
        sut.snapshot(Count { through: 10 }).await.expect("durable");
        append_all(&sut, 10..15).await;
        sut.close().await.expect("closes");

        let (sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(
            recovered.snapshot,
            Some(Count { through: 10 }),
            "{}",
            fixture.name
        );
        assert_eq!(recovered.entries, entries(10..15), "{}", fixture.name);
        sut.snapshot(Count { through: 15 }).await.expect("durable");
        append_all(&sut, 15..20).await;
        sut.snapshot(Count { through: 20 }).await.expect("durable");
        sut.close().await.expect("closes");

        let listing = Listing::read(&fixture.store).await.expect("lists");
        assert_eq!(
            listing.snapshots.len(),
            1,
            "{}: older snapshots are deleted",
            fixture.name
        );
        assert!(
            listing.segments.len() <= 2,
            "{}: covered segments are deleted, left {:?}",
            fixture.name,
            listing.segments
        );
        let (_sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(
            recovered.snapshot,
            Some(Count { through: 20 }),
            "{}",
            fixture.name
        );
        assert_eq!(recovered.entries, Vec::new(), "{}", fixture.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_short_is_discarded() {
    for tail in ["half a frame", "zeros"] {
        let fixture = local();
        let (sut, _) = reopen(&fixture.store).await;
        append_all(&sut, 0..20).await;
        sut.close().await.expect("closes");
        let (name, mut bytes) = largest_segment(&fixture.store).await;
        let mut frame = Vec::new();
        push_frame(
            &mut frame,
            RecordKind::Entry,
            &postcard::to_stdvec(&entry(20)).expect("encodes"),
        );
        let torn = match tail {
            "half a frame" => frame[..frame.len() / 2].to_vec(),
            _ => vec![0; 4096],
        };
        bytes.extend_from_slice(&torn);
        fixture.store.overwrite(&name, bytes).await;

        let (sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(recovered.entries, entries(0..20), "{tail}");
        assert_eq!(recovered.discarded_bytes, torn.len() as u64, "{tail}");
        append_all(&sut, 20..25).await;
        sut.close().await.expect("closes");
        let (_sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(recovered.entries, entries(0..25), "{tail}");
        assert_eq!(
            recovered.discarded_bytes, 0,
            "{tail}: the tail lies before the new segment"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_object_is_damage_not_a_torn_write() {
    let fixture = memory();
    let (sut, _) = reopen(&fixture.store).await;
    append_all(&sut, 0..20).await;
    sut.close().await.expect("closes");
    let (name, bytes) = last_segment(&fixture.store).await;
    fixture
        .store
        .overwrite(&name, bytes[..bytes.len() - 3].to_vec())
        .await;
    let error = open_as(&fixture.store, "job-1").await.expect_err("damaged");
    assert!(
        matches!(&error, JournalError::Corrupt { object, .. } if object.ends_with(&name)),
        "{error}"
    );
    assert!(error.to_string().contains("never cut short"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_before_the_end_is_an_error_naming_the_object_and_offset() {
    for fixture in fixtures() {
        let (sut, _) = reopen(&fixture.store).await;
        append_all(&sut, 0..10).await;
        sut.close().await.expect("closes");
        let (name, mut bytes) = largest_segment(&fixture.store).await;
        let third = parse_segment(&bytes, None).expect("a segment").frames[2].offset as usize;
        bytes[third + FRAME_HEADER + 3] ^= 0x10;
        fixture.store.overwrite(&name, bytes).await;

        let error = open_as(&fixture.store, "job-1").await.expect_err("damaged");
        match &error {
            JournalError::Corrupt { object, offset, .. } => {
                assert_eq!(object, &fixture.store.object_uri(&name), "{}", fixture.name);
                assert_eq!(*offset, third as u64, "{}", fixture.name);
            }
            other => panic!("{}: expected Corrupt, got {other}", fixture.name),
        }
        // Damage in the last segment is told from a torn tail by the frame after it; in an earlier
        // segment (appends grouped into more than one write), by the segment after it.
        let (last, _) = last_segment(&fixture.store).await;
        let message = error.to_string();
        if last == name {
            assert!(message.contains("well-formed frame follows"), "{message}");
        }
        assert!(message.contains("before the journal's end"), "{message}");
        assert!(message.contains("restore the object"), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_segment_is_an_error_naming_its_neighbours() {
    for fixture in fixtures() {
        for round in 0..3 {
            let (sut, _) = reopen(&fixture.store).await;
            append_all(&sut, round * 10..round * 10 + 10).await;
            sut.close().await.expect("closes");
        }
        let listing = Listing::read(&fixture.store).await.expect("lists");
        assert!(listing.segments.len() >= 3, "{}: {listing:?}", fixture.name);
        let middle = listing.segments[listing.segments.len() / 2];
        fixture
            .store
            .delete(vec![segment_name(middle)])
            .await
            .expect("deletes");

        let error = open_as(&fixture.store, "job-1").await.expect_err("a gap");
        assert!(
            matches!(error, JournalError::MissingRecords { from, .. } if from == middle),
            "{}: {error}",
            fixture.name
        );
        assert!(
            error.to_string().contains("restore it from a backup"),
            "{error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_an_error() {
    for fixture in fixtures() {
        let (sut, _) = reopen(&fixture.store).await;
        append_all(&sut, 0..10).await;
        sut.snapshot(Count { through: 10 }).await.expect("durable");
        sut.close().await.expect("closes");
        let listing = Listing::read(&fixture.store).await.expect("lists");
        let name = snapshot_name(listing.snapshots[0]);
        let mut bytes = fixture
            .store
            .read(&name)
            .await
            .expect("reads")
            .expect("exists")
            .to_vec();
        *bytes.last_mut().expect("a body") ^= 1;
        fixture.store.overwrite(&name, bytes).await;

        let error = open_as(&fixture.store, "job-1").await.expect_err("damaged");
        assert!(
            matches!(&error, JournalError::Corrupt { object, .. } if object.ends_with(&name)),
            "{}: {error}",
            fixture.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_fences_the_first() {
    for fixture in fixtures() {
        let (first, _) = reopen(&fixture.store).await;
        append_all(&first, 0..5).await;
        let (second, recovered) = reopen(&fixture.store).await;
        assert_eq!(recovered.entries, entries(0..5), "{}", fixture.name);

        let late = first.append(&entry(100)).await.expect_err("fenced");
        assert!(
            matches!(late, JournalError::Fenced { .. }),
            "{}: {late}",
            fixture.name
        );
        assert!(late.to_string().contains("stop this process"), "{late}");
        let later = first.append(&entry(101)).await.expect_err("still fenced");
        assert!(matches!(later, JournalError::Fenced { .. }), "{later}");
        assert!(
            first.close().await.is_err(),
            "{}: close reports the fence",
            fixture.name
        );

        append_all(&second, 5..10).await;
        second.close().await.expect("closes");
        if let Store::Local(_) = fixture.store {
            // The fenced writer's refused append did reach its file, past the second writer's
            // first record: replay must ignore it.
            let listing = Listing::read(&fixture.store).await.expect("lists");
            let bytes = fixture
                .store
                .read(&segment_name(listing.segments[0]))
                .await
                .expect("reads")
                .expect("exists");
            let frames = parse_segment(&bytes, None).expect("a segment").frames.len() as u64;
            assert!(
                frames > listing.segments[1] - listing.segments[0],
                "{frames} frames"
            );
        }
        let (_sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(recovered.entries, entries(0..10), "{}", fixture.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_is_refused_without_fencing() {
    for fixture in fixtures() {
        let (sut, _) = open_as(&fixture.store, "job-a").await.expect("opens");
        append_all(&sut, 0..3).await;
        let error = open_as(&fixture.store, "job-b")
            .await
            .expect_err("another job");
        let message = error.to_string();
        assert!(
            matches!(error, JournalError::IdentityMismatch { .. }),
            "{message}"
        );
        assert!(
            message.contains("\"job-a\"") && message.contains("\"job-b\""),
            "{message}"
        );
        assert!(message.contains("use another checkpoint URI"), "{message}");
        append_all(&sut, 3..6).await;
        sut.close().await.expect("the first writer was not fenced");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_entry_fails_alone() {
    let fixture = local();
    let (sut, _) = reopen(&fixture.store).await;
    let huge = Entry {
        number: 0,
        note: "x".repeat(frame::MAX_FRAME_PAYLOAD),
    };
    let error = sut.append(&huge).await.expect_err("too large");
    assert!(
        error.to_string().contains("keep large state in snapshots"),
        "{error}"
    );
    append_all(&sut, 0..3).await;
    sut.close().await.expect("closes");
    let (_sut, recovered) = reopen(&fixture.store).await;
    assert_eq!(recovered.entries, entries(0..3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_journal_still_writes_what_was_queued() {
    for fixture in fixtures() {
        let (sut, _) = reopen(&fixture.store).await;
        let durables: Vec<Durable> = (0..50).map(|number| sut.append(&entry(number))).collect();
        drop(sut);
        for durable in durables {
            durable.await.expect("durable after drop");
        }
        let (_sut, recovered) = reopen(&fixture.store).await;
        assert_eq!(recovered.entries, entries(0..50), "{}", fixture.name);
    }
}

#[tokio::test]
async fn a_store_that_overwrites_what_it_was_asked_to_create_only_if_absent_is_refused_at_open() {
    let remote = Arc::new(RemoteLike {
        overwrites: true,
        ..RemoteLike::default()
    });
    let prefix = ObjectPrefix::new(remote, "jobs/one", "memory:///jobs/one");
    let Err(error) = open_as(&Store::Object(Arc::new(prefix)), "job-1").await else {
        panic!("a store that cannot fence writers is refused");
    };
    let message = error.to_string();
    assert!(
        message.contains("memory:///jobs/one") && message.contains("only if absent"),
        "{message}"
    );
    let honest = memory();
    open_as(&honest.store, "job-1")
        .await
        .expect("a store that refuses the second create opens");
    let probes = honest.store.list("probes").await.expect("lists");
    assert!(probes.is_empty(), "the probe is removed: {probes:?}");
}

#[tokio::test]
async fn a_writer_generation_named_with_the_largest_number_is_an_error_naming_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("ckpt");
    let store = Store::open(path.to_str().expect("utf-8"), &StorageOptions::new()).expect("local");
    let (journal, _) = reopen(&store).await;
    journal.close().await.expect("closes");
    let planted = format!("writers/{:020}", u64::MAX);
    std::fs::write(path.join(&planted), b"").expect("plant a generation");
    let Err(error) = open_as(&store, "job-1").await else {
        panic!("no generation comes after it");
    };
    let message = error.to_string();
    assert!(
        message.contains(&planted) && message.contains("move it out"),
        "{message}"
    );
}

#[tokio::test]
async fn an_object_store_write_that_found_no_descriptor_is_tried_again_and_the_journal_goes_on() {
    let fixture = memory();
    let remote = fixture.remote.clone().expect("an object store");
    let (sut, _) = reopen(&fixture.store).await;
    remote.descriptor_shortages.store(3, Ordering::Relaxed);
    append_all(&sut, 0..10).await;
    assert_eq!(
        remote.descriptor_shortages.load(Ordering::Relaxed),
        0,
        "the shortages were met"
    );
    assert!(sut.failure().is_none(), "the journal is not lost");
    sut.close().await.expect("closes");
    let (_sut, recovered) = reopen(&fixture.store).await;
    assert_eq!(recovered.entries, entries(0..10));
}

#[test]
fn a_file_operation_waits_through_a_shortage_of_descriptors_and_returns_other_errors() {
    let mut tries = 0;
    let outcome = super::store::through_descriptor_shortage("file:///j", "opening", || {
        tries += 1;
        if tries < 3 {
            Err(std::io::Error::from_raw_os_error(libc::EMFILE))
        } else {
            Ok(tries)
        }
    });
    assert_eq!(outcome.expect("opened once a descriptor was free"), 3);
    let mut tries = 0;
    let error = super::store::through_descriptor_shortage("file:///j", "opening", || {
        tries += 1;
        Err::<(), _>(std::io::Error::from_raw_os_error(libc::ENOSPC))
    })
    .expect_err("another error is returned");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(tries, 1, "and not tried again");
}

#[test]
fn a_shortage_of_descriptors_is_told_apart_among_the_causes_of_an_error() {
    let shortage = JournalError::store(
        "memory:///j/journal/1.log",
        "creating",
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(std::io::Error::from_raw_os_error(libc::ENFILE)),
        },
    );
    assert!(shortage.is_descriptor_shortage());
    let full = JournalError::io(
        "file:///j/journal/1.log",
        "appending",
        std::io::Error::from_raw_os_error(libc::ENOSPC),
    );
    assert!(!full.is_descriptor_shortage());
    let fenced = JournalError::Fenced {
        uri: "file:///j".into(),
        by: "another AM".into(),
    };
    assert!(!fenced.is_descriptor_shortage());
}
