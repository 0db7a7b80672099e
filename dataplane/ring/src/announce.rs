//! Trainers that someone else launched (torchrun, srun, a Kubernetes Job) announce themselves to
//! their node's daemon through a file beside the rings.
//!
//! A trainer of a job whose AM launches nothing writes `<job dir>/<local rank>.trainer`, one line of
//! `key=value` fields, then waits for `<job dir>/<local rank>.ring`:
//!
//! ```text
//! rank=3 local_rank=1 world_size=4 local_world_size=2 pid=4242
//! ```
//!
//! The node's daemon reads the announcements of live processes and opens a ring for each local
//! rank `0..local_world_size`. The Python client writes the same line (`sluice._attach`); a field
//! it does not know is ignored, so later fields can be added.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The extension of an announcement file.
pub const ANNOUNCE_EXTENSION: &str = "trainer";

/// Where a trainer stands in the job, as its launcher numbered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announcement {
    /// Its global rank (`RANK`, `SLURM_PROCID`, `SLUICE_RANK`).
    pub rank: u32,
    /// Its rank on this node (`LOCAL_RANK`, `SLURM_LOCALID`): it names its ring.
    pub local_rank: u32,
    /// The trainers of the job (`WORLD_SIZE`, `SLURM_NTASKS`).
    pub world_size: u32,
    /// The trainers on this node (`LOCAL_WORLD_SIZE`, `SLURM_NTASKS_PER_NODE`).
    pub local_world_size: u32,
    /// Its process id, so that the announcement of a trainer that is gone is passed over.
    pub pid: u32,
}

impl Announcement {
    /// The line written to the file.
    pub fn to_line(&self) -> String {
        format!(
            "rank={} local_rank={} world_size={} local_world_size={} pid={}\n",
            self.rank, self.local_rank, self.world_size, self.local_world_size, self.pid
        )
    }

    /// Reads a line written by [`Announcement::to_line`]; the error names the field that is
    /// missing or malformed, or the ranks that do not fit.
    pub fn parse(line: &str) -> Result<Announcement, String> {
        let field = |name: &str| -> Result<u32, String> {
            line.split_whitespace()
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                .ok_or_else(|| format!("no `{name}=` field"))?
                .parse()
                .map_err(|error| format!("`{name}`: {error}"))
        };
        let announcement = Announcement {
            rank: field("rank")?,
            local_rank: field("local_rank")?,
            world_size: field("world_size")?,
            local_world_size: field("local_world_size")?,
            pid: field("pid")?,
        };
        if announcement.rank >= announcement.world_size
            || announcement.local_rank >= announcement.local_world_size
            || announcement.local_world_size > announcement.world_size
        {
            return Err(format!(
                "ranks out of range: rank {} of {}, local rank {} of {}",
                announcement.rank,
                announcement.world_size,
                announcement.local_rank,
                announcement.local_world_size
            ));
        }
        Ok(announcement)
    }

    /// The trainer's ranks from its launcher's environment (the order of the Python client's
    /// `sluice._attach`): rank from `SLUICE_RANK`, `RANK` (torchrun), `SLURM_PROCID` (srun); world
    /// size from `SLUICE_WORLD_SIZE`, `WORLD_SIZE`, `SLURM_NTASKS` (1 when none is set); local
    /// rank from `SLUICE_LOCAL_RANK`, `LOCAL_RANK`, `SLURM_LOCALID`, else the rank; local world
    /// size from `SLUICE_LOCAL_WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `SLURM_NTASKS_PER_NODE`, the first
    /// count of `SLURM_TASKS_PER_NODE`, else the world size. `None` when no launcher set a rank;
    /// the error names a variable that is not a number, or ranks that do not fit.
    pub fn from_env() -> Result<Option<Announcement>, String> {
        Announcement::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Announcement>, String> {
        let first = |names: &[&str]| -> Result<Option<u32>, String> {
            for name in names {
                match var(name).filter(|value| !value.is_empty()) {
                    Some(value) => {
                        return value.trim().parse().map(Some).map_err(|_| {
                            format!("{name}={value:?}: expected a whole number; check how the trainer was launched")
                        });
                    }
                    None => continue,
                }
            }
            Ok(None)
        };
        let Some(rank) = first(&["SLUICE_RANK", "RANK", "SLURM_PROCID"])? else {
            return Ok(None);
        };
        let world_size = first(&["SLUICE_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS"])?.unwrap_or(1);
        let local_rank = first(&["SLUICE_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"])?;
        let slurm_per_node = var("SLURM_TASKS_PER_NODE").and_then(|value| {
            let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        });
        let local_world_size = first(&[
            "SLUICE_LOCAL_WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "SLURM_NTASKS_PER_NODE",
        ])?
        .or(slurm_per_node);
        let announcement = Announcement {
            rank,
            local_rank: local_rank.unwrap_or(rank),
            world_size,
            local_world_size: local_world_size.unwrap_or(world_size),
            pid: std::process::id(),
        };
        Announcement::parse(&announcement.to_line())
            .map(Some)
            .map_err(|why| format!("trainer {why}; check RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (or SLUICE_RANK and SLUICE_WORLD_SIZE)"))
    }

    /// The file of the trainer of `local_rank` under `job_dir`.
    pub fn path(job_dir: &Path, local_rank: u32) -> PathBuf {
        job_dir.join(format!("{local_rank}.{ANNOUNCE_EXTENSION}"))
    }

    /// Writes the announcement under `job_dir` (created if absent), replacing an earlier one of the
    /// same local rank at once: the line goes to a temporary file that is then renamed.
    pub fn write(&self, job_dir: &Path) -> io::Result<PathBuf> {
        // Made before the daemon's, it is this user's alone; the daemon checks and keeps it.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(job_dir)?;
        let path = Announcement::path(job_dir, self.local_rank);
        let temporary = job_dir.join(format!(".{}.{}.tmp", self.local_rank, std::process::id()));
        // The trainer may run as another user of the daemon's group: the file takes the
        // directory's sharing, and a name planted in advance is removed, never followed.
        let mut file = crate::files::Sharing::of_dir(job_dir)
            .and_then(|sharing| crate::files::create_temporary(&temporary, sharing))
            .map_err(io::Error::other)?;
        file.write_all(self.to_line().as_bytes())?;
        std::fs::rename(&temporary, &path)?;
        Ok(path)
    }
}

/// What the announcements under a job directory say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announced {
    /// The announcements of live processes, by local rank.
    pub trainers: Vec<Announcement>,
    /// Files that could not be read, with why: named in the daemon's log.
    pub unreadable: Vec<(PathBuf, String)>,
}

impl Announced {
    /// The node's local world size, once every local rank of it has announced itself: the ranks
    /// to open rings for, `0..local_world_size`.
    pub fn complete(&self) -> Option<u32> {
        let size = self.trainers.first()?.local_world_size;
        let agree = self
            .trainers
            .iter()
            .all(|trainer| trainer.local_world_size == size);
        (agree && (0..size).all(|rank| self.trainers.iter().any(|t| t.local_rank == rank)))
            .then_some(size)
    }
}

/// Reads the announcements under `job_dir`, passing over those whose process is gone (as
/// `/proc/<pid>` tells: the trainers share the daemon's process namespace). An absent directory
/// holds none.
pub fn announced(job_dir: &Path) -> io::Result<Announced> {
    let mut found = Announced::default();
    let entries = match std::fs::read_dir(job_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(found),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let path = entry?.path();
        if path.extension().and_then(|extension| extension.to_str()) != Some(ANNOUNCE_EXTENSION) {
            continue;
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => {
                found.unreadable.push((path, error.to_string()));
                continue;
            }
        };
        match Announcement::parse(&text) {
            Ok(announcement) => {
                if Path::new(&format!("/proc/{}", announcement.pid)).exists() {
                    found.trainers.push(announcement);
                }
            }
            Err(why) => found.unreadable.push((path, why)),
        }
    }
    found.trainers.sort_by_key(|trainer| trainer.local_rank);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trainer(rank: u32, local_rank: u32, pid: u32) -> Announcement {
        Announcement {
            rank,
            local_rank,
            world_size: 4,
            local_world_size: 2,
            pid,
        }
    }

    #[test]
    fn a_line_reads_back_and_unknown_fields_are_ignored() {
        let sut = trainer(3, 1, 42);
        assert_eq!(Announcement::parse(&sut.to_line()), Ok(sut));
        let later = format!("host=n1 {}", sut.to_line());
        assert_eq!(Announcement::parse(&later), Ok(sut));
        let error = Announcement::parse("rank=1 local_rank=0").expect_err("fields missing");
        assert!(error.contains("world_size"), "{error}");
        let error = Announcement::parse(&trainer(5, 1, 1).to_line()).expect_err("rank 5 of 4");
        assert!(error.contains("out of range"), "{error}");
    }

    #[test]
    fn ranks_come_from_torchrun_srun_or_sluice_variables_in_that_order() {
        let from = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect();
            Announcement::from_vars(|name| {
                pairs
                    .iter()
                    .find(|(found, _)| found == name)
                    .map(|(_, value)| value.clone())
            })
        };
        assert_eq!(from(&[]), Ok(None));
        let torchrun = from(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
        ])
        .expect("valid")
        .expect("a trainer");
        assert_eq!(
            (
                torchrun.rank,
                torchrun.local_rank,
                torchrun.world_size,
                torchrun.local_world_size
            ),
            (3, 1, 4, 2)
        );
        let srun = from(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_TASKS_PER_NODE", "3(x2)"),
        ])
        .expect("valid")
        .expect("a trainer");
        assert_eq!(
            (
                srun.rank,
                srun.local_rank,
                srun.world_size,
                srun.local_world_size
            ),
            (5, 2, 6, 3)
        );
        let sluice = from(&[
            ("SLUICE_RANK", "1"),
            ("SLUICE_WORLD_SIZE", "2"),
            ("RANK", "0"),
        ])
        .expect("valid")
        .expect("a trainer");
        assert_eq!(
            (sluice.rank, sluice.local_rank, sluice.local_world_size),
            (1, 1, 2)
        );
        let error = from(&[("RANK", "two")]).expect_err("not a number");
        assert!(error.contains("RANK=\"two\""), "{error}");
        let error = from(&[("RANK", "4"), ("WORLD_SIZE", "4")]).expect_err("rank 4 of 4");
        assert!(error.contains("out of range"), "{error}");
    }

    #[test]
    fn the_node_is_complete_once_every_local_rank_of_a_live_process_announced() {
        let directory = tempfile::tempdir().expect("tempdir");
        let me = std::process::id();
        assert_eq!(announced(directory.path()).expect("read").complete(), None);
        trainer(2, 0, me).write(directory.path()).expect("write");
        assert_eq!(announced(directory.path()).expect("read").complete(), None);
        // A trainer that is gone (pid 0 names no process in /proc) counts for nothing.
        trainer(3, 1, 0).write(directory.path()).expect("write");
        assert_eq!(announced(directory.path()).expect("read").complete(), None);
        trainer(3, 1, me).write(directory.path()).expect("write");
        let found = announced(directory.path()).expect("read");
        assert_eq!(found.complete(), Some(2));
        assert_eq!(found.trainers, vec![trainer(2, 0, me), trainer(3, 1, me)]);
        std::fs::write(directory.path().join("7.trainer"), "garbage").expect("write");
        let found = announced(directory.path()).expect("read");
        assert_eq!(found.unreadable.len(), 1);
        assert_eq!(found.complete(), Some(2));
    }
}
