//! Zero-copy reads of local files from a read-only shared mapping, safe against files that shrink while
//! they are mapped.
//!
//! A decoder can read the ranges of a file whose pages the page cache already holds straight from a
//! mapping of the file ([`Mapping`]; the formats layer does so for Parquet column chunks): a read copies
//! every byte once from the page cache into a buffer, and with two decoders those copies compete for the
//! memory bandwidth the decoders need themselves.
//!
//! A mapping has one hazard a read has not: when the file is truncated while it is mapped, an access to a
//! page past the new end raises `SIGBUS`, which ends the process. The handler this module installs takes
//! the faults inside the mappings it registered: it maps a page of zeros over the page that faulted,
//! marks the mapping as faulted, and lets the access go on. Any other `SIGBUS` goes to the handler
//! that was there before, or to the default action, which ends the process as it would have without
//! this module. A user of a mapping settles what it decoded before it hands it on: it copies out of the
//! mapping whatever still points into it ([`Mapping::overlaps`] tells), then calls [`Mapping::check`],
//! for which a mapping that faulted is an error, so bytes of zeros never reach a reader as data.
//!
//! A mapping has a second hazard, which raises no signal: a file rewritten in place at the same length, or
//! rewritten past the pages already read, hands the decoder other bytes than those of the file it
//! planned from. [`FileIdentity`] records what tells one version of a file from another (device and
//! inode, size, and the modification and status change times to the nanosecond); a user of a mapping
//! records it when it opens the file and calls [`FileIdentity::verify`] after decoding, with the open file
//! and its path, so that a file rewritten or replaced while it was read is an error too.
//!
//! The handler finds the mapping of an address in a fixed table of slots that it reads without blocking:
//! each slot's range sits behind a sequence number that is odd while the range changes. A mapping takes
//! a slot after `mmap` and gives it back before `munmap`, so a registered range is always mapped.

use std::ffi::c_void;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

/// Mappings registered at once; a file opened while every slot is taken is read by copy.
const SLOTS: usize = 1024;

/// `si_code` of a `SIGBUS` raised by an access to a page of a mapping past the end of its file
/// (`include/uapi/asm-generic/siginfo.h`; the `libc` crate does not define it).
const BUS_ADRERR: libc::c_int = 2;

/// One registered mapping, as the signal handler sees it.
struct Slot {
    /// Taken by a live [`Mapping`].
    taken: AtomicBool,
    /// Even while `start..end` is stable, odd while it changes.
    sequence: AtomicUsize,
    start: AtomicUsize,
    end: AtomicUsize,
    /// Set by the handler when an access to the mapping faulted.
    faulted: AtomicBool,
}

impl Slot {
    const fn new() -> Self {
        Self {
            taken: AtomicBool::new(false),
            sequence: AtomicUsize::new(0),
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            faulted: AtomicBool::new(false),
        }
    }

    fn set_range(&self, range: Range<usize>) {
        // AcqRel/Release: the odd sequence is seen before the new range, and the even one after it; the
        // handler's loads pair with these stores.
        self.sequence.fetch_add(1, Ordering::AcqRel);
        self.start.store(range.start, Ordering::Release);
        self.end.store(range.end, Ordering::Release);
        self.sequence.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether `address` lies in the slot's range, read without blocking (from the signal handler).
    fn holds(&self, address: usize) -> bool {
        // Acquire: pairs with the stores of `set_range`; a sequence that is odd, or that changed while
        // the range was read, means the range may be torn.
        let before = self.sequence.load(Ordering::Acquire);
        let start = self.start.load(Ordering::Acquire);
        let end = self.end.load(Ordering::Acquire);
        let after = self.sequence.load(Ordering::Acquire);
        before.is_multiple_of(2) && before == after && (start..end).contains(&address)
    }
}

static REGISTRY: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];

/// The page size, set before the handler is installed.
static PAGE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The `SIGBUS` action found when the handler was installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Whether the handler is installed (installed once, on the first mapping).
static INSTALLED: OnceLock<bool> = OnceLock::new();

extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: the handler is installed with SA_SIGINFO, so the kernel passes a valid siginfo_t, and for
    // SIGBUS its address field is set.
    let (code, address) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == BUS_ADRERR
        && let Some(slot) = REGISTRY.iter().find(|slot| slot.holds(address))
    {
        let page = PAGE_BYTES.load(Ordering::Relaxed);
        let base = address & !(page - 1);
        // SAFETY: the page lies inside a mapping this module made, which stays mapped while its slot holds
        // it, and which the faulting thread is reading, so it is not being unmapped. MAP_FIXED replaces
        // that one page with a private page of zeros; nothing else is mapped there.
        let zeros = unsafe {
            libc::mmap(
                base as *mut c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if zeros != libc::MAP_FAILED {
            // SeqCst: set before the access that faulted completes, so any thread that later sees what
            // that access produced sees the flag.
            slot.faulted.store(true, Ordering::SeqCst);
            return;
        }
    }
    forward(signal, info, context);
}

/// Hands a `SIGBUS` this module does not own to the action found when the handler was installed.
fn forward(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let previous = PREVIOUS
        .get()
        .filter(|previous| ![libc::SIG_DFL, libc::SIG_IGN].contains(&previous.sa_sigaction));
    match previous {
        Some(previous) if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: an SA_SIGINFO action holds a three-argument handler, called as the kernel would.
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(previous.sa_sigaction) };
            handler(signal, info, context);
        }
        Some(previous) => {
            // SAFETY: an action without SA_SIGINFO holds a one-argument handler.
            let handler: extern "C" fn(libc::c_int) =
                unsafe { std::mem::transmute(previous.sa_sigaction) };
            handler(signal);
        }
        None => {
            // The default action: the access faults again on return, and the signal ends the process.
            // SAFETY: a zeroed sigaction with SIG_DFL is a valid action; sigaction is async-signal-safe.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
    }
}

/// Installs the handler once; false when the system refused it.
fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let Ok(page) = usize::try_from(page) else {
            return false;
        };
        if !page.is_power_of_two() {
            return false;
        }
        PAGE_BYTES.store(page, Ordering::Relaxed);
        // SAFETY: both sigaction structs are valid for the calls; the first call only reads the current
        // action, which is kept before the handler that forwards to it is installed.
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return false;
            }
            let previous = *PREVIOUS.get_or_init(|| previous);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
                libc::sigaction(libc::SIGBUS, &previous, std::ptr::null_mut());
                return false;
            }
        }
        true
    })
}

/// `length` bytes of `file` from `offset`, mapped read-only with their pages read in now (so that a
/// reader of them does not wait for the device later), as `Bytes` that unmap once the last of them is
/// dropped: a zero-copy read for a file that is **never written or shortened in place** once it is
/// complete, such as a disk cache's entry, written whole under another name and renamed into place.
///
/// The mapping is not registered with the `SIGBUS` handler: a mapping that could fault must be settled
/// before what was decoded from it leaves (see [`Mapping`]), and such a file gives it nothing to settle.
/// `offset` need not be aligned to a page.
pub fn map_frozen(file: &File, offset: u64, length: usize) -> std::io::Result<Bytes> {
    if length == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the mapping is read-only and owned by the `Bytes` it becomes, which hand out shared views
    // only. The caller's file is complete and never written or shortened in place (a new version
    // is a new file renamed over it, and removing it keeps the inode while it is mapped), so the mapped
    // bytes neither change nor go past the file's end while the mapping lives.
    let map = unsafe {
        memmap2::MmapOptions::new()
            .offset(offset)
            .len(length)
            .populate()
            .map(file)
    }?;
    Ok(Bytes::from_owner(map))
}

/// A read-only shared mapping of a local file, registered with the `SIGBUS` handler.
pub struct Mapping {
    map: memmap2::Mmap,
    slot: &'static Slot,
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Mapping")
            .field("length", &self.map.len())
            .field("faulted", &self.faulted())
            .finish()
    }
}

impl Mapping {
    /// Maps the first `length` bytes of `file`. `None` when there is nothing to map, when the handler could
    /// not be installed, or when every slot is taken: the caller then reads by copy.
    pub fn new(file: &File, length: u64) -> std::io::Result<Option<Arc<Mapping>>> {
        let Ok(length) = usize::try_from(length) else {
            return Ok(None);
        };
        if length == 0 || !install() {
            return Ok(None);
        }
        let Some(slot) = REGISTRY.iter().find(|slot| {
            // Acquire: a slot given back is seen with its range cleared.
            slot.taken
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        }) else {
            return Ok(None);
        };
        // SAFETY: the mapping is read-only and shared, and read only through `Bytes` from
        // `Mapping::bytes`. A file truncated while mapped raises SIGBUS on the pages past its end, which the
        // handler turns into pages of zeros and a fault that `check` reports, which the user of the mapping
        // calls before anything decoded from it leaves.
        let map = match unsafe { memmap2::MmapOptions::new().len(length).map(file) } {
            Ok(map) => map,
            Err(error) => {
                // Release: the slot is free again.
                slot.taken.store(false, Ordering::Release);
                return Err(error);
            }
        };
        // SeqCst: a flag from the slot's previous mapping is cleared before the new range is visible.
        slot.faulted.store(false, Ordering::SeqCst);
        let start = map.as_ptr() as usize;
        slot.set_range(start..start + length);
        Ok(Some(Arc::new(Mapping { map, slot })))
    }

    /// The whole file as `Bytes` that keep the mapping alive; slices of it are zero-copy reads.
    pub fn bytes(self: &Arc<Self>) -> Bytes {
        Bytes::from_owner(Owner(Arc::clone(self)))
    }

    /// Whether the page cache holds every page of `range` (`mincore`), so that reading it from the mapping
    /// does not wait for the device.
    pub fn resident(&self, range: Range<usize>) -> bool {
        let page = PAGE_BYTES.load(Ordering::Relaxed);
        if range.start >= range.end || range.end > self.map.len() {
            return false;
        }
        let first = range.start & !(page - 1);
        let length = range.end - first;
        let mut pages = vec![0u8; length.div_ceil(page)];
        // SAFETY: `first..range.end` lies inside the mapping and starts on a page boundary (the mapping
        // does), and `pages` has one byte for each of its pages.
        let status = unsafe {
            libc::mincore(
                self.map.as_ptr().add(first) as *mut c_void,
                length,
                pages.as_mut_ptr(),
            )
        };
        status == 0 && pages.iter().all(|page| page & 1 == 1)
    }

    /// Whether an access to the mapping faulted: the file shrank while it was mapped.
    pub fn faulted(&self) -> bool {
        // SeqCst: pairs with the handler's store.
        self.slot.faulted.load(Ordering::SeqCst)
    }

    /// An error (`UnexpectedEof`) when an access to the mapping faulted: whatever was decoded since may
    /// hold zeros, and an error the decoder raised may come from them.
    pub fn check(&self) -> std::io::Result<()> {
        if self.faulted() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                SHRANK,
            ));
        }
        Ok(())
    }

    /// Whether `memory` overlaps the mapping: a slice of it, or a value built on one, keeps the mapping's
    /// pages in use and must be copied out before the mapping may fault unseen.
    pub fn overlaps(&self, memory: &[u8]) -> bool {
        let start = self.map.as_ptr() as usize;
        let pointer = memory.as_ptr() as usize;
        pointer < start + self.map.len() && start < pointer + memory.len()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // The slot is cleared before `map` is unmapped (fields drop after this), so the handler never
        // matches a range that is no longer mapped.
        self.slot.set_range(0..0);
        // Release: the cleared range is seen by the next mapping that takes the slot.
        self.slot.taken.store(false, Ordering::Release);
    }
}

/// Keeps a [`Mapping`] alive for as long as `Bytes` from it exist.
struct Owner(Arc<Mapping>);

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        &self.0.map
    }
}

/// The error of a batch decoded after an access to the mapping faulted.
const SHRANK: &str = "the file shrank while it was read, so rows decoded from it may hold zeros in \
    place of its bytes; a data file must not be rewritten in place: write a new file instead";

/// The mapping a local file reader makes on its first zero-copy read, shared with whatever settles what
/// is decoded from it. Empty for files that are not mapped.
#[derive(Debug, Clone, Default)]
pub struct LazyMapping(Arc<OnceLock<Option<Arc<Mapping>>>>);

impl LazyMapping {
    /// The mapping of `file`, made on the first call; `None` when it cannot be mapped.
    pub fn get_or_map(&self, file: &File, length: u64, uri: &str) -> Option<&Arc<Mapping>> {
        self.0
            .get_or_init(|| match Mapping::new(file, length) {
                Ok(mapping) => mapping,
                Err(error) => {
                    tracing::debug!(uri, %error, "file not mapped; it is read by copy");
                    None
                }
            })
            .as_ref()
    }

    /// [`Mapping::check`] when the file was mapped.
    pub fn check(&self) -> std::io::Result<()> {
        self.get().map_or(Ok(()), |mapping| mapping.check())
    }

    /// The mapping, when one was made.
    pub fn get(&self) -> Option<&Arc<Mapping>> {
        self.0.get().and_then(Option::as_ref)
    }
}

/// What tells one version of a local file from another, as `stat` gives it: a file rewritten in place
/// changes its size, its modification time or its status change time (which no user can set back), and
/// a file replaced through a rename onto its path is another inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    device: u64,
    inode: u64,
    size: u64,
    /// Modification time: seconds and nanoseconds since the epoch.
    modified: (i64, i64),
    /// Status change time: seconds and nanoseconds since the epoch.
    changed: (i64, i64),
}

impl FileIdentity {
    /// The identity of an open file (`fstat`).
    pub fn of(file: &File) -> std::io::Result<Self> {
        Ok(Self::from_metadata(&file.metadata()?))
    }

    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file's modification time in nanoseconds since the Unix epoch; `None` past what an `i64`
    /// holds (the year 2262).
    pub fn modified_ns(&self) -> Option<i64> {
        let (seconds, nanoseconds) = self.modified;
        seconds.checked_mul(1_000_000_000)?.checked_add(nanoseconds)
    }

    /// The identity of the file at `path` now (`stat`, through symbolic links).
    fn at(path: &Path) -> std::io::Result<Self> {
        Ok(Self::from_metadata(&std::fs::metadata(path)?))
    }

    fn from_metadata(metadata: &std::fs::Metadata) -> Self {
        Self {
            device: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.size(),
            modified: (metadata.mtime(), metadata.mtime_nsec()),
            changed: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }

    /// The names of what differs between `self` and `other`, in the order `stat` lists them.
    fn differences(&self, other: &Self) -> Vec<&'static str> {
        [
            ("device", self.device != other.device),
            ("inode", self.inode != other.inode),
            ("size", self.size != other.size),
            ("mtime", self.modified != other.modified),
            ("ctime", self.changed != other.changed),
        ]
        .into_iter()
        .filter_map(|(name, differs)| differs.then_some(name))
        .collect()
    }

    /// An error (`Other`) when the file at `path`, or `file` (the same file, opened by that path), is not
    /// this version of the file any more: it was rewritten in place, replaced by a rename onto its path,
    /// or removed; bytes read from it since it had this identity may be another file's.
    pub fn verify(&self, file: &File, path: &Path) -> std::io::Result<()> {
        let at_path = match Self::at(path) {
            Ok(identity) => identity,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(std::io::Error::other(format!(
                    "the file was removed or renamed while it was read; {MUST_NOT_CHANGE}"
                )));
            }
            Err(error) => return Err(error),
        };
        for now in [at_path, Self::of(file)?] {
            let differences = self.differences(&now);
            if !differences.is_empty() {
                return Err(std::io::Error::other(format!(
                    "the file was replaced or rewritten while it was read ({} changed); {MUST_NOT_CHANGE}",
                    differences.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// The rule and the fix that the errors of [`FileIdentity::verify`] end with.
const MUST_NOT_CHANGE: &str = "a data file must not change while a job reads it: write new data to \
    files of new names instead";

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    const CHILD: &str = "SLUICE_MAPPED_SIGBUS_CHILD";

    fn page() -> usize {
        assert!(install(), "the SIGBUS handler installs");
        PAGE_BYTES.load(Ordering::Relaxed)
    }

    /// A file of `pages` pages, each filled with its own index plus one.
    fn paged_file(pages: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let content: Vec<u8> = (0..pages)
            .flat_map(|index| std::iter::repeat_n(index as u8 + 1, page()))
            .collect();
        let mut file = tempfile::NamedTempFile::new().expect("tempfile");
        file.write_all(&content).expect("write");
        file.as_file().sync_all().expect("sync");
        (file, content)
    }

    fn mapped(file: &tempfile::NamedTempFile, length: usize) -> Arc<Mapping> {
        Mapping::new(file.as_file(), length as u64)
            .expect("maps")
            .expect("a free slot")
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "mmap, mincore and a SIGBUS handler, which Miri cannot run"
    )]
    fn a_mapping_reads_the_file_and_knows_which_pages_are_cached() {
        let (file, content) = paged_file(4);
        // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open. The file was
        // synced, so its pages are clean and can be dropped; none is mapped yet.
        let status = unsafe {
            libc::posix_fadvise(file.as_file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
        };
        assert_eq!(status, 0, "dropping the file from the page cache");
        let sut = mapped(&file, content.len());
        assert!(!sut.resident(0..content.len()), "the pages were dropped");
        assert!(!sut.resident(2 * page()..2 * page() + 1));
        assert_eq!(&sut.bytes()[..], &content[..]);
        assert!(sut.resident(0..content.len()), "read through the mapping");
        assert!(
            sut.resident(2 * page() + 1..3 * page() - 1),
            "a range inside pages"
        );
        assert!(!sut.resident(0..content.len() + 1), "past the mapping");
        assert!(!sut.faulted());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "mmap, mincore and a SIGBUS handler, which Miri cannot run"
    )]
    fn an_access_past_the_end_of_a_shrunk_file_reads_zeros_and_fails_the_check() {
        let (file, content) = paged_file(3);
        let sut = mapped(&file, content.len());
        let (other_file, other_content) = paged_file(1);
        let other = mapped(&other_file, other_content.len());
        let bytes = sut.bytes();
        file.as_file().set_len(page() as u64).expect("truncate");
        assert_eq!(bytes[0], 1, "the page that stays holds the file's bytes");
        assert!(!sut.faulted());
        assert_eq!(
            bytes[2 * page()],
            0,
            "a page past the new end reads as zeros"
        );
        assert!(sut.faulted());
        assert!(!other.faulted(), "only the mapping that faulted is flagged");
        assert_eq!(other.bytes()[0], 1);
        let error = sut.check().expect_err("a faulted mapping fails");
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(error.to_string().contains("shrank while it was read"));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "mmap, mincore and a SIGBUS handler, which Miri cannot run"
    )]
    fn a_slice_overlaps_the_mapping_it_points_into_and_no_other() {
        let (file, content) = paged_file(2);
        let sut = mapped(&file, content.len());
        let (other_file, other_content) = paged_file(1);
        let other = mapped(&other_file, other_content.len());
        let bytes = sut.bytes();
        assert!(sut.overlaps(&bytes[page()..page() + 16]));
        assert!(sut.overlaps(&bytes[content.len() - 1..]));
        assert!(!other.overlaps(&bytes[..16]));
        assert!(!sut.overlaps(&content[..16]), "a copy is not the mapping");
    }

    #[test]
    #[cfg_attr(miri, ignore = "stat, rename and utimensat, which Miri cannot run")]
    fn an_identity_tells_a_file_rewritten_in_place_at_the_same_length() {
        let (file, content) = paged_file(2);
        let sut = FileIdentity::of(file.as_file()).expect("fstat");
        sut.verify(file.as_file(), file.path())
            .expect("an unchanged file passes");
        let modified = file
            .as_file()
            .metadata()
            .expect("stat")
            .modified()
            .expect("mtime");
        // A status change time later than the recorded one also where file times keep the granularity of
        // a clock tick (Linux before 6.13 gives the time of the last tick, not of the change).
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut rewrite = std::fs::OpenOptions::new()
            .write(true)
            .open(file.path())
            .expect("open for writing");
        rewrite.write_all(&vec![9; content.len()]).expect("rewrite");
        // The same size, and the mtime the file had: only the status change time tells the rewrite.
        rewrite.set_modified(modified).expect("set mtime");
        let error = sut
            .verify(file.as_file(), file.path())
            .expect_err("a rewritten file fails");
        assert_eq!(
            error.to_string(),
            "the file was replaced or rewritten while it was read (ctime changed); a data file must \
             not change while a job reads it: write new data to files of new names instead"
        );
        rewrite
            .set_modified(modified + std::time::Duration::from_secs(1))
            .expect("set mtime");
        let error = sut
            .verify(file.as_file(), file.path())
            .expect_err("a rewritten file fails");
        assert!(
            error.to_string().contains("(mtime, ctime changed)"),
            "{error}"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "fstat and utimensat, which Miri cannot run")]
    fn an_identity_gives_the_size_and_the_modification_time_to_the_nanosecond() {
        let (file, content) = paged_file(1);
        let modified = std::time::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 123_456_789);
        file.as_file().set_modified(modified).expect("set mtime");
        let sut = FileIdentity::of(file.as_file()).expect("fstat");
        assert_eq!(sut.size(), content.len() as u64);
        assert_eq!(sut.modified_ns(), Some(1_700_000_000_123_456_789));
    }

    #[test]
    #[cfg_attr(miri, ignore = "stat, rename and utimensat, which Miri cannot run")]
    fn an_identity_tells_a_file_replaced_by_a_rename_or_removed() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("data");
        std::fs::write(&path, [1; 64]).expect("write");
        let file = File::open(&path).expect("open");
        let sut = FileIdentity::of(&file).expect("fstat");
        let other = directory.path().join("other");
        std::fs::write(&other, [1; 64]).expect("write");
        std::fs::rename(&other, &path).expect("rename onto the path");
        let error = sut.verify(&file, &path).expect_err("a replaced file fails");
        assert!(
            error
                .to_string()
                .contains("replaced or rewritten while it was read (inode"),
            "{error}"
        );
        std::fs::remove_file(&path).expect("remove");
        let error = sut.verify(&file, &path).expect_err("a removed file fails");
        assert!(
            error
                .to_string()
                .starts_with("the file was removed or renamed while it was read"),
            "{error}"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "spawns a process, which Miri cannot")]
    fn a_sigbus_outside_the_mappings_still_ends_the_process() {
        let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "mapped::tests::foreign_sigbus",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .expect("runs the child");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            child.status.signal(),
            Some(libc::SIGBUS),
            "the child dies of SIGBUS: {}",
            String::from_utf8_lossy(&child.stderr)
        );
        assert!(
            String::from_utf8_lossy(&child.stdout).contains("the handler is installed"),
            "the child got as far as the foreign access: {}",
            String::from_utf8_lossy(&child.stdout)
        );
    }

    #[test]
    #[ignore = "run in a child process by a_sigbus_outside_the_mappings_still_ends_the_process"]
    fn foreign_sigbus() {
        assert!(std::env::var_os(CHILD).is_some(), "run as a child only");
        let (registered, content) = paged_file(1);
        let _mapping = mapped(&registered, content.len());
        let (foreign, content) = paged_file(2);
        // SAFETY: a read-only mapping of a file only this test uses; the access past the end after the
        // truncation raises the SIGBUS the test is about.
        let map = unsafe { memmap2::Mmap::map(foreign.as_file()) }.expect("maps");
        foreign.as_file().set_len(0).expect("truncate");
        println!("the handler is installed");
        let byte = std::hint::black_box(&map[..])[content.len() - 1];
        println!("read {byte} past the end of the file");
    }
}
