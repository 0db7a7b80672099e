//! An AM whose journal cannot be written steps down: its journal lives on a 1 MiB tmpfs that fills
//! up. The change it can no longer record is refused (a daemon's call gets `unavailable`, so it
//! looks for another AM), and the AM exits non-zero naming the cause. Mounting the tmpfs needs
//! root: `scripts/test.sh` runs this test as root or under CI.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::LoggedAm;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).expect("the mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount -t tmpfs failed ({status}): run this test as root, as scripts/test.sh does"
        );
        Tmpfs {
            path: path.to_path_buf(),
        }
    }

    /// Writes a file until the file system is full.
    fn fill(&self) {
        let mut filler = std::fs::File::create(self.path.join("filler")).expect("the filler");
        let chunk = vec![0u8; 4096];
        while filler.write_all(&chunk).is_ok() {}
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

#[test]
#[ignore = "needs root to mount a tmpfs: scripts/test.sh runs it as root"]
fn an_am_whose_journal_disk_is_full_refuses_the_change_and_exits_naming_the_cause() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let disk = Tmpfs::mount(&root.join("small"), "1m");
    let spec = common::one_node_spec(root, "full", &disk.path.join("journal"));
    let am = LoggedAm::start(&spec, &root.join("am.err"));
    common::register_node(&am.address, "full").expect("the AM serves");

    disk.fill();
    // An append that still fits the last page of the segment succeeds: register until one does not.
    let refused = (0..1_000)
        .find_map(|_| common::register_node(&am.address, "full").err())
        .expect("a registration the full disk cannot record is refused");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    let (succeeded, log) = am.exit();
    assert!(!succeeded, "the AM exits non-zero: {log}");
    assert!(
        log.contains("this AM steps down") && log.contains("No space left on device"),
        "{log}"
    );
}
