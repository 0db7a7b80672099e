//! Files and directories that belong to one user: rings, ledgers, executor pid files and logs.
//!
//! On a shared host `/dev/shm` and `/tmp` are writable by every user, so a fixed name there can be
//! created first by someone else. The rules here:
//! - A directory Sluice keeps state in is the user's own: created with mode 0700 (0770 and the
//!   group of [`Sharing::Group`]), and refused when it exists but belongs to another user. One that
//!   belongs to the user with a looser mode (made by an older release, or under another umask) is
//!   tightened. Every directory above it must belong to the user or to root, and one writable by
//!   others must be sticky (as `/tmp` and `/dev/shm` are), so that nobody else can move it away and
//!   put another in its place.
//! - A file is created new (`O_CREAT | O_EXCL`, which also refuses a symlink in its place) with
//!   `O_NOFOLLOW` and mode 0600 (0660), so that a name planted in advance never redirects a write.
//! - A file that Sluice takes over (a ring and its ledger left by a daemon that stopped) must be a
//!   regular file of the user's.

use std::ffi::CString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Who may open the files Sluice creates besides their owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharing {
    /// The user alone: files 0600, directories 0700.
    #[default]
    Private,
    /// The user and the members of one group (trainers running under another user of that group):
    /// files 0660, directories 0770, both of that group.
    Group(u32),
}

impl Sharing {
    /// Shares with the group named `name` (or given by number), which the user must belong to.
    ///
    /// # Errors
    ///
    /// Names the group when it does not exist.
    pub fn group(name: &str) -> Result<Sharing, FileError> {
        if let Ok(gid) = name.parse::<u32>() {
            return Ok(Sharing::Group(gid));
        }
        let unknown = || FileError::UnknownGroup {
            name: name.to_owned(),
        };
        let c_name = CString::new(name).map_err(|_| unknown())?;
        let mut group = std::mem::MaybeUninit::<libc::group>::uninit();
        let mut buffer = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call: `c_name` is a NUL-terminated string, `group`
        // and `found` are writable, and `buffer` is writable for the length given. `getgrnam_r`
        // writes the entry's strings into `buffer` only.
        let status = unsafe {
            libc::getgrnam_r(
                c_name.as_ptr(),
                group.as_mut_ptr(),
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut found,
            )
        };
        if status != 0 || found.is_null() {
            return Err(unknown());
        }
        // SAFETY: `getgrnam_r` returned 0 with `found` pointing at `group`, which it filled.
        Ok(Sharing::Group(unsafe { group.assume_init() }.gr_gid))
    }

    /// The sharing of the directory `path`, for the files created in it: its group's when the
    /// group may write to it (a directory made for [`Sharing::Group`] is 0770), else the user's
    /// alone.
    ///
    /// # Errors
    ///
    /// The error of `stat`.
    pub fn of_dir(path: &Path) -> Result<Sharing, FileError> {
        let metadata = fs::metadata(path).map_err(io_error(path, "stat"))?;
        Ok(if metadata.mode() & 0o020 != 0 {
            Sharing::Group(metadata.gid())
        } else {
            Sharing::Private
        })
    }

    /// The mode of the files created.
    pub fn file_mode(self) -> u32 {
        match self {
            Sharing::Private => 0o600,
            Sharing::Group(_) => 0o660,
        }
    }

    /// The mode of the directories created.
    pub fn dir_mode(self) -> u32 {
        match self {
            Sharing::Private => 0o700,
            Sharing::Group(_) => 0o770,
        }
    }

    fn gid(self) -> Option<u32> {
        match self {
            Sharing::Private => None,
            Sharing::Group(gid) => Some(gid),
        }
    }
}

/// Why a file or directory cannot be trusted or made.
#[derive(Debug)]
pub enum FileError {
    /// Another user owns it.
    ForeignOwner {
        path: PathBuf,
        owner: u32,
        user: u32,
    },
    /// A directory above it could let another user replace it.
    UnsafeParent { path: PathBuf, reason: String },
    /// It is not what it should be: a symlink, or not a regular file or directory.
    WrongKind { path: PathBuf, found: &'static str },
    /// No group of that name.
    UnknownGroup { name: String },
    /// The operating system refused an operation.
    Io {
        path: PathBuf,
        operation: &'static str,
        source: io::Error,
    },
}

impl fmt::Display for FileError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileError::ForeignOwner { path, owner, user } => write!(
                formatter,
                "{} belongs to uid {owner}, not to this user (uid {user}): another user made it, and its files cannot be trusted; remove it (as its owner or root) or choose another directory",
                path.display()
            ),
            FileError::UnsafeParent { path, reason } => write!(
                formatter,
                "{}: {reason}; keep Sluice's directories under one owned by this user or by root",
                path.display()
            ),
            FileError::WrongKind { path, found } => write!(
                formatter,
                "{} is {found}, not what Sluice made there; remove it",
                path.display()
            ),
            FileError::UnknownGroup { name } => write!(
                formatter,
                "no group named {name}: give an existing group (see `getent group`) that this user and the trainers' users belong to"
            ),
            FileError::Io {
                path,
                operation,
                source,
            } => write!(formatter, "{}: {operation}: {source}", path.display()),
        }
    }
}

impl std::error::Error for FileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FileError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl FileError {
    /// The error of the operating system, if that is what it is.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            FileError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

fn io_error(path: &Path, operation: &'static str) -> impl FnOnce(io::Error) -> FileError {
    let path = path.to_path_buf();
    move |source| FileError::Io {
        path,
        operation,
        source,
    }
}

/// The effective user id of this process.
pub fn user() -> u32 {
    // SAFETY: `geteuid` takes nothing and cannot fail.
    unsafe { libc::geteuid() }
}

/// The size in bytes of the file system that holds `path` (all of it, used or free).
///
/// # Errors
///
/// The error of `statvfs`.
pub fn filesystem_bytes(path: &Path) -> Result<u64, FileError> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|error| FileError::Io {
        path: path.to_path_buf(),
        operation: "statvfs",
        source: io::Error::new(io::ErrorKind::InvalidInput, error),
    })?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string and `stats` points at writable memory for one
    // statvfs.
    let status = unsafe { libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) };
    if status != 0 {
        return Err(io_error(path, "statvfs")(io::Error::last_os_error()));
    }
    // SAFETY: statvfs returned 0, so it filled `stats`.
    let stats = unsafe { stats.assume_init() };
    Ok(stats.f_blocks.saturating_mul(stats.f_frsize))
}

/// Makes `path` and any directory missing above it, each with `sharing`'s mode, and checks that
/// `path` is a directory of this user's that nobody else can replace (see the module's rules).
///
/// # Errors
///
/// [`FileError::ForeignOwner`] for a directory of another user's, [`FileError::UnsafeParent`] for
/// a directory above it that another user could swap, [`FileError::WrongKind`] for a symlink or a
/// file in its place, [`FileError::Io`] when it cannot be made.
pub fn ensure_dir(path: &Path, sharing: Sharing) -> Result<(), FileError> {
    let mut missing = Vec::new();
    let mut existing = path;
    loop {
        match fs::symlink_metadata(existing) {
            Ok(_) => break,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                missing.push(existing);
                match existing.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => existing = parent,
                    _ => {
                        existing = Path::new(".");
                        break;
                    }
                }
            }
            Err(error) => return Err(io_error(existing, "stat")(error)),
        }
    }
    if missing.is_empty() {
        own_dir(path, sharing)?;
        return match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => check_ancestors(parent),
            _ => check_ancestors(Path::new(".")),
        };
    }
    check_ancestors(existing)?;
    for directory in missing.into_iter().rev() {
        match fs::DirBuilder::new()
            .mode(sharing.dir_mode())
            .create(directory)
        {
            Ok(()) => {}
            // Made meanwhile by another process: checked below like any existing one.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(io_error(directory, "create directory")(error)),
        }
        own_dir(directory, sharing)?;
    }
    own_dir(path, sharing)
}

/// Checks `path`, a directory that exists, and every one above it: each must belong to this user
/// or to root, and one that others may write to must be sticky.
fn check_ancestors(path: &Path) -> Result<(), FileError> {
    let user = user();
    let absolute = fs::canonicalize(path).map_err(io_error(path, "resolve"))?;
    for directory in absolute.ancestors() {
        let metadata = fs::metadata(directory).map_err(io_error(directory, "stat"))?;
        let mode = metadata.mode();
        if metadata.uid() != user && metadata.uid() != 0 {
            return Err(FileError::UnsafeParent {
                path: directory.to_path_buf(),
                reason: format!(
                    "it belongs to uid {}, who could replace what Sluice keeps inside",
                    metadata.uid()
                ),
            });
        }
        let sticky = mode & libc::S_ISVTX != 0;
        if mode & 0o002 != 0 && !sticky {
            return Err(FileError::UnsafeParent {
                path: directory.to_path_buf(),
                reason: "every user may write to it and it is not sticky (chmod +t), so anyone could replace what Sluice keeps inside".to_owned(),
            });
        }
    }
    Ok(())
}

/// Checks that `path` is a directory of this user's, and gives it `sharing`'s mode and group.
fn own_dir(path: &Path, sharing: Sharing) -> Result<(), FileError> {
    let metadata = fs::symlink_metadata(path).map_err(io_error(path, "stat"))?;
    check_kind_and_owner(path, &metadata, fs::Metadata::is_dir)?;
    if let Some(gid) = sharing.gid()
        && metadata.gid() != gid
    {
        chown(path, gid)?;
    }
    if metadata.mode() & 0o7777 != sharing.dir_mode() {
        fs::set_permissions(path, fs::Permissions::from_mode(sharing.dir_mode()))
            .map_err(io_error(path, "chmod"))?;
    }
    Ok(())
}

fn chown(path: &Path, gid: u32) -> Result<(), FileError> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| FileError::Io {
        path: path.to_path_buf(),
        operation: "chown",
        source: io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"),
    })?;
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call; `lchown` does not follow
    // a symlink and reads nothing else. A uid of -1 (as unsigned) keeps the owner.
    let result = unsafe { libc::lchown(c_path.as_ptr(), u32::MAX, gid) };
    if result != 0 {
        return Err(FileError::Io {
            path: path.to_path_buf(),
            operation: "give the directory its group (this user must belong to the group)",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Creates `path`, which must not exist, for reading and writing, with `sharing`'s mode and group.
/// Refuses a symlink in its place: nothing planted at the name redirects the write.
///
/// # Errors
///
/// `AlreadyExists` (through [`FileError::io_kind`]) when the name is taken, or the error of
/// creating it.
pub fn create_new(path: &Path, sharing: Sharing) -> Result<File, FileError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(sharing.file_mode())
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io_error(path, "create"))?;
    // The umask may have taken bits the sharing asks for.
    file.set_permissions(fs::Permissions::from_mode(sharing.file_mode()))
        .map_err(io_error(path, "chmod"))?;
    if let Some(gid) = sharing.gid() {
        std::os::unix::fs::fchown(&file, None, Some(gid)).map_err(io_error(
            path,
            "give the file its group (this user must belong to the group)",
        ))?;
    }
    Ok(file)
}

/// Creates the temporary file `path` for a write that will be renamed or linked into place,
/// removing first what an earlier process of the same pid may have left there (a symlink is
/// removed, never followed).
///
/// # Errors
///
/// The error of removing what is there or of creating the file.
pub fn create_temporary(path: &Path, sharing: Sharing) -> Result<File, FileError> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(io_error(path, "remove a leftover temporary file")(error)),
    }
    create_new(path, sharing)
}

/// Opens `path` for appending, creating it with `sharing`'s mode if absent; refuses a symlink and a
/// file of another user's.
///
/// # Errors
///
/// [`FileError::WrongKind`] for a symlink or not a regular file, [`FileError::ForeignOwner`], or
/// the error of opening it.
pub fn open_append(path: &Path, sharing: Sharing) -> Result<File, FileError> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(sharing.file_mode())
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => FileError::WrongKind {
                path: path.to_path_buf(),
                found: "a symlink",
            },
            _ => io_error(path, "open")(source),
        })?;
    let metadata = file.metadata().map_err(io_error(path, "stat"))?;
    check_kind_and_owner(path, &metadata, fs::Metadata::is_file)?;
    Ok(file)
}

/// Checks that `path` is a regular file of this user's, not a symlink: one that Sluice may take
/// over.
///
/// # Errors
///
/// [`FileError::WrongKind`], [`FileError::ForeignOwner`], or the error of `lstat`.
pub fn check_owned(path: &Path) -> Result<(), FileError> {
    let metadata = fs::symlink_metadata(path).map_err(io_error(path, "stat"))?;
    check_kind_and_owner(path, &metadata, fs::Metadata::is_file)
}

/// Fails unless `metadata` (of `path`, not followed through a symlink) is of the kind `is_kind`
/// accepts and belongs to this user.
fn check_kind_and_owner(
    path: &Path,
    metadata: &fs::Metadata,
    is_kind: fn(&fs::Metadata) -> bool,
) -> Result<(), FileError> {
    if !is_kind(metadata) {
        return Err(FileError::WrongKind {
            path: path.to_path_buf(),
            found: kind(metadata),
        });
    }
    let user = user();
    if metadata.uid() != user {
        return Err(FileError::ForeignOwner {
            path: path.to_path_buf(),
            owner: metadata.uid(),
            user,
        });
    }
    Ok(())
}

fn kind(metadata: &fs::Metadata) -> &'static str {
    let file_type = metadata.file_type();
    if file_type.is_symlink() {
        "a symlink"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

/// The uid a process runs as (the owner of `/proc/<pid>`), `None` when no such process runs.
pub fn process_owner(pid: u32) -> Option<u32> {
    fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|metadata| metadata.uid())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).expect("stat").mode() & 0o7777
    }

    #[test]
    #[cfg_attr(miri, ignore = "calls statvfs, which Miri cannot")]
    fn a_file_systems_size_holds_its_files_and_a_missing_path_is_named() {
        let root = tempfile::tempdir().expect("tempdir");
        let file = root.path().join("one");
        fs::write(&file, vec![0_u8; 1 << 16]).expect("write");
        let size = filesystem_bytes(root.path()).expect("statvfs");
        assert!(size >= 1 << 16, "{size}");
        let missing = root.path().join("missing");
        let error = filesystem_bytes(&missing).expect_err("no such path");
        assert!(
            error
                .to_string()
                .starts_with(&format!("{}: statvfs", missing.display())),
            "{error}"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "uses file modes, owners and /proc, which Miri cannot")]
    fn directories_are_made_private_and_loose_ones_of_the_user_tightened() {
        let root = tempfile::tempdir().expect("tempdir");
        let deep = root.path().join("a/b/c");
        ensure_dir(&deep, Sharing::Private).expect("made");
        for made in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&root.path().join(made)), 0o700, "{made}");
        }
        let loose = root.path().join("loose");
        fs::create_dir(&loose).expect("mkdir");
        fs::set_permissions(&loose, fs::Permissions::from_mode(0o777)).expect("chmod");
        ensure_dir(&loose, Sharing::Private).expect("tightened");
        assert_eq!(mode(&loose), 0o700);
    }

    #[test]
    #[cfg_attr(miri, ignore = "uses file modes, owners and /proc, which Miri cannot")]
    fn a_group_share_gives_the_group_and_its_modes() {
        let root = tempfile::tempdir().expect("tempdir");
        // SAFETY: `getegid` takes nothing and cannot fail.
        let gid = unsafe { libc::getegid() };
        let sharing = Sharing::group(&gid.to_string()).expect("numeric group");
        let directory = root.path().join("shared");
        ensure_dir(&directory, sharing).expect("made");
        assert_eq!(mode(&directory), 0o770);
        let file = directory.join("f");
        create_new(&file, sharing).expect("created");
        assert_eq!(mode(&file), 0o660);
        assert_eq!(fs::metadata(&file).expect("stat").gid(), gid);
        let error = Sharing::group("no-such-group-of-sluice").expect_err("unknown");
        assert!(error.to_string().contains("getent group"), "{error}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "uses file modes, owners and /proc, which Miri cannot")]
    fn a_symlink_in_place_of_a_directory_or_a_new_file_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let elsewhere = root.path().join("elsewhere");
        fs::create_dir(&elsewhere).expect("mkdir");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).expect("symlink");
        let error = ensure_dir(&link, Sharing::Private).expect_err("a symlink");
        assert!(
            matches!(
                error,
                FileError::WrongKind {
                    found: "a symlink",
                    ..
                }
            ),
            "{error}"
        );

        let victim = root.path().join("victim");
        fs::write(&victim, "precious").expect("write");
        let planted = root.path().join("planted");
        std::os::unix::fs::symlink(&victim, &planted).expect("symlink");
        let error = create_new(&planted, Sharing::Private).expect_err("planted");
        assert_eq!(error.io_kind(), Some(io::ErrorKind::AlreadyExists));
        let error = open_append(&planted, Sharing::Private).expect_err("planted");
        assert!(matches!(error, FileError::WrongKind { .. }), "{error}");
        let error = check_owned(&planted).expect_err("planted");
        assert!(matches!(error, FileError::WrongKind { .. }), "{error}");
        // A temporary name is cleared, never followed.
        let mut file = create_temporary(&planted, Sharing::Private).expect("replaced");
        io::Write::write_all(&mut file, b"new").expect("write");
        assert_eq!(fs::read_to_string(&victim).expect("read"), "precious");
        assert_eq!(mode(&planted), 0o600);
    }

    #[test]
    #[cfg_attr(miri, ignore = "uses file modes, owners and /proc, which Miri cannot")]
    fn a_world_writable_parent_that_is_not_sticky_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let open = root.path().join("open");
        fs::create_dir(&open).expect("mkdir");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
        let error = ensure_dir(&open.join("rings"), Sharing::Private).expect_err("unsafe");
        assert!(matches!(error, FileError::UnsafeParent { .. }), "{error}");
        assert!(error.to_string().contains("sticky"), "{error}");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).expect("chmod");
        ensure_dir(&open.join("rings"), Sharing::Private).expect("a sticky parent is safe");
    }

    #[test]
    #[cfg_attr(miri, ignore = "uses file modes, owners and /proc, which Miri cannot")]
    fn this_process_runs_as_this_user() {
        assert_eq!(process_owner(std::process::id()), Some(user()));
        assert_eq!(process_owner(u32::MAX), None);
    }
}
