//! Several hosts on one machine, made of Linux namespaces: a test bed for multi-host tests.
//!
//! [`NetBed::new`] makes one [`Host`] per name. Each host has
//!
//! - its own network namespace, with loopback up and one interface, `eth0`, cabled to the bed's
//!   switch and holding the host's own IPv4 address ([`Host::address`]); no default route, so a host
//!   reaches loopback and the bed's own addresses only;
//! - its own mount namespace, which lives as long as the bed: private tmpfs mounts on `/dev/shm` and
//!   `/tmp`, and on `/etc/hosts` a file that names every host of the bed, so host names resolve on
//!   every host (torchrun's rendezvous, gloo). A process started on a host later sees the `/dev/shm`
//!   an earlier one left. The caller's directories that lie under `/tmp` or `/dev/shm` and that its
//!   hosts run from are carried into each host's private mounts, at the same paths
//!   ([`NetBed::caller_dirs`]): the target directory of the running program (so a test's binaries
//!   run on the hosts from a `CARGO_TARGET_DIR` under `/tmp`), the checkout it was built from, the
//!   directories on `PATH`, and any directory given to [`NetBed::sharing`];
//! - its own UTS namespace, whose hostname is the host's name.
//!
//! [`Host::command`] gives a [`Command`] that runs a program on the host. The test process itself
//! reaches every host by address through the bed's root leg ([`NetBed::root_address`]), where it can
//! also serve what the hosts need, such as a [`DelayProxy`](crate::DelayProxy). Files a test shares with
//! its hosts (job specs, data, trainers' outputs) go in [`NetBed::shared_dir`], at the same path on
//! every host and in the test: not in a new directory under `/tmp`, which is private to each host
//! unless given to [`NetBed::sharing`].
//!
//! [`Host::link_down`] and [`Host::link_up`] unplug and plug a host's cable; [`Host::kill_all`] kills
//! every process running on a host. Dropping the bed kills the processes of all its hosts, unmounts and
//! deletes its namespaces, interfaces and directory, also when the test panics.
//!
//! Hosts share the rest of the machine: the file system outside `/dev/shm` and `/tmp`, users,
//! process ids (a host's processes are visible from the test and from every other host), `/proc`
//! and `/sys` (whose `class/net` lists the test's interfaces, not the host's: ask `ip` instead).
//!
//! ```no_run
//! use sluice_testkit::NetBed;
//!
//! let bed = NetBed::new(&["n1", "n2"]).unwrap_or_else(|error| panic!("{error}"));
//! let spec = bed.shared_dir().join("job.yaml");
//! std::fs::write(&spec, "name: job\n").expect("write the spec");
//! let mut job = bed.host("n1").command("sluice").arg("run").arg(&spec).spawn().expect("spawn");
//! bed.host("n2").link_down();
//! assert!(job.wait().expect("wait").success());
//! ```
//!
//! # Requirements
//!
//! Making namespaces takes root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`), iproute2 (`ip`) and
//! util-linux (`unshare`, `nsenter`, `mount`). [`NetBed::new`] checks them first ([`NetBed::check`])
//! and returns an error naming what is missing or refused. The tests that use a bed are marked
//! `#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]` and live in test
//! binaries named `netbed*`: a plain `cargo test` reports them as ignored, and `./scripts/test.sh`
//! runs them with `--ignored`, where a refused namespace fails them.
//!
//! # Implementation
//!
//! A bed has an index, from 0 to 255, which names all it makes:
//!
//! | what | where or name |
//! |---|---|
//! | the bed's lock, held by the process owning the bed | `/run/sluice-netbed/<index>.lock` |
//! | the bed's directory, bind-mounted on itself and made private | `/run/sluice-netbed/<index>/` |
//! | the pid of the process owning the bed (for people) | `<bed>/owner` |
//! | the hosts file bind-mounted on every host's `/etc/hosts` | `<bed>/hosts` |
//! | a host's mount and UTS namespaces, bound to files | `<bed>/ns/<host>.mnt`, `<bed>/ns/<host>.uts` |
//! | the shared directory | `<bed>/shared/` |
//! | the switch's network namespace, holding the bridge `br0` | `sluice-netbed-<index>_switch` (`ip netns`) |
//! | a host's network namespace | `sluice-netbed-<index>-<host>` (`ip netns`) |
//! | the n-th host's cable: `h<n>` in the switch, `eth0` on the host | address `10.147.<index>.<n + 2>/24` |
//! | the root leg: `root` in the switch, `snb<index>` in the test's namespace | address `10.147.<index>.1/24` |
//!
//! A new bed takes the lowest index whose lock no live process holds (`flock`, released by the kernel
//! when its process dies, however it dies) and whose subnet the test's namespace routes nowhere yet.
//! Before that it tears down every bed whose lock is free but whose remains are still there: the
//! processes on its hosts, its mounts, namespaces and root leg, its directory. Dropping a bed does
//! the same teardown for its own index before it releases the lock. Lock files stay, empty: removing
//! a lock file another process may be about to lock would let two processes own one index.
//!
//! A caller's directory under `/tmp` or `/dev/shm` is carried into a host as the host's mount
//! namespace is made, before the private tmpfs mounts hide it: bound on a directory of the bed
//! (`<bed>/carry/<host>/<n>`), then moved onto the same path in the new tmpfs. So the host sees the
//! caller's files there, writes to them go to the caller's, and the rest of its `/tmp` stays its own.
//! Of the program's own paths, the whole directory directly under the private mount is carried
//! (`/tmp/clone` for a target directory `/tmp/clone/target`), so that a checkout and its target
//! directory go together; a directory given to [`NetBed::sharing`] is carried as it is.
//!
//! A host's processes are found by their namespaces: every process whose network or mount namespace
//! is one of the host's, however it was started. A host's mount namespace is a copy of the test's
//! when it is made, so it would hold copies of other beds' mounts, and through them their network
//! namespaces, alive; it unmounts them (`/run/netns` and the other beds' directories) first.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where beds keep their locks and directories.
const BEDS_DIRECTORY: &str = "/run/sluice-netbed";
/// Where `ip netns` keeps its namespaces.
const NETNS_DIRECTORY: &str = "/run/netns";
/// The first part of the name of every network namespace of a bed.
const NETNS_PREFIX: &str = "sluice-netbed-";
/// The first part of the name of a bed's root leg.
const ROOT_LEG_PREFIX: &str = "snb";
/// How many beds may exist at once on a machine: one `/24` of `10.147.0.0/16` each.
const MAX_BEDS: u32 = 256;
/// The first two octets of every bed's subnet.
const SUBNET_OCTETS: [u8; 2] = [10, 147];
/// How many hosts a bed can hold: `.2` to `.254` of its subnet.
const MAX_HOSTS: usize = 253;
/// How long killed processes may take to go.
const KILL_WATCHDOG: Duration = Duration::from_secs(10);
/// The mount points a host gets a private tmpfs on, hiding the caller's files there but for the
/// directories carried in.
const PRIVATE_MOUNTS: [&str; 2] = ["/dev/shm", "/tmp"];
/// The file cargo writes at the top of every target directory.
const TARGET_DIRECTORY_TAG: &str = "CACHEDIR.TAG";
/// The programs a bed runs, with where to get them.
const PROGRAMS: [(&str, &str); 8] = [
    ("ip", "iproute2"),
    ("nsenter", "util-linux"),
    ("unshare", "util-linux"),
    ("mount", "mount (util-linux)"),
    ("umount", "mount (util-linux)"),
    ("mountpoint", "util-linux"),
    ("kill", "procps"),
    ("sh", "a POSIX shell (dash)"),
];

/// Why a bed could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NetBedError {
    /// The test does not run as root.
    #[error(
        "netbed: making namespaces needs root, and this test runs as uid {euid}: run it as root \
         (./scripts/test.sh runs the netbed tests as root, or with CI=true)"
    )]
    NotRoot {
        /// The effective user id of the test.
        euid: u32,
    },
    /// A program the bed runs is not installed.
    #[error("netbed: `{program}` is not on PATH: install {package}")]
    MissingProgram {
        /// The program.
        program: &'static str,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// The kernel refused to make a namespace, an interface or a mount.
    #[error(
        "netbed: `{command}` was refused: {stderr}; namespaces need root with CAP_SYS_ADMIN and \
         CAP_NET_ADMIN, outside a container that forbids them"
    )]
    Refused {
        /// The command that was refused.
        command: String,
        /// What it printed.
        stderr: String,
    },
    /// A step of making the bed failed for another reason.
    #[error("netbed: `{command}` failed: {stderr}")]
    Failed {
        /// The command that failed.
        command: String,
        /// What it printed.
        stderr: String,
    },
    /// A host name cannot be a host name.
    #[error(
        "netbed: host name {name:?} {reason}: use 1 to 63 lowercase letters, digits and '-', \
         starting with a letter"
    )]
    HostName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Every index is taken, or its subnet is routed elsewhere.
    #[error("netbed: no bed index is free: {reasons}; drop beds, or remove the routes named")]
    NoFreeIndex {
        /// Why each index that was not taken by a live bed could not be used.
        reasons: String,
    },
    /// Remains of a dead bed could not be removed.
    #[error("netbed: bed {index} left by a dead test cannot be removed: {problems}")]
    Stale {
        /// The bed's index.
        index: u32,
        /// What could not be removed.
        problems: String,
    },
    /// A file or directory of the bed could not be written.
    #[error("netbed: {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Several hosts on this machine, each in its own network, mount and UTS namespaces; torn down when
/// dropped (see [the module](self)).
#[derive(Debug)]
pub struct NetBed {
    index: u32,
    directory: PathBuf,
    hosts: Vec<Host>,
    /// The caller's directories carried into the hosts' private mounts.
    caller_dirs: Vec<PathBuf>,
    /// Held for the bed's life: dropped after [`Drop::drop`] has torn the bed down.
    _lock: File,
}

/// One host of a [`NetBed`].
#[derive(Debug)]
pub struct Host {
    name: String,
    address: Ipv4Addr,
    /// Its network namespace's name (`ip netns`).
    netns: String,
    /// The file its mount namespace is bound to.
    mount_namespace: PathBuf,
    /// The file its UTS namespace is bound to.
    uts_namespace: PathBuf,
    /// The switch's network namespace.
    switch_netns: String,
    /// The switch's end of the host's cable.
    switch_leg: String,
    /// The bed's shared directory: the working directory of the commands run on the host.
    shared_dir: PathBuf,
}

impl NetBed {
    /// Makes a bed with one host per name, after tearing down the beds dead tests left behind.
    ///
    /// # Errors
    ///
    /// Returns an error naming the cause when the test is not root, a program is missing, the kernel
    /// refuses a namespace, a name is not a valid host name or used twice, or no bed index is free.
    pub fn new(names: &[&str]) -> Result<NetBed, NetBedError> {
        NetBed::sharing(names, &[])
    }

    /// Makes a bed as [`NetBed::new`] does, whose hosts also see each of `dirs`, directories of the
    /// caller, at the same path: one under `/tmp` or `/dev/shm` is carried into every host's
    /// private mount there (any other directory is shared with the hosts anyway).
    ///
    /// # Errors
    ///
    /// Returns the errors of [`NetBed::new`], and one naming a path of `dirs` that is not a
    /// directory.
    pub fn sharing(names: &[&str], dirs: &[&Path]) -> Result<NetBed, NetBedError> {
        Self::check()?;
        check_names(names)?;
        let caller_dirs = caller_dirs(dirs)?;
        std::fs::create_dir_all(BEDS_DIRECTORY).map_err(|source| NetBedError::Io {
            path: BEDS_DIRECTORY.into(),
            source,
        })?;
        sweep_stale_beds()?;
        let (index, lock) = claim_index()?;
        match build(index, names, &caller_dirs) {
            Ok(hosts) => Ok(NetBed {
                index,
                directory: bed_directory(index),
                hosts,
                caller_dirs,
                _lock: lock,
            }),
            Err(error) => {
                let problems = tear_down(index);
                if !problems.is_empty() {
                    eprintln!(
                        "netbed {index}: removing the half-made bed left {}; the next bed removes it",
                        problems.join("; ")
                    );
                }
                Err(error)
            }
        }
    }

    /// Checks that this process can make a bed: it is root, the programs a bed runs are installed,
    /// and the kernel lets it make network, mount and UTS namespaces.
    ///
    /// # Errors
    ///
    /// Returns an error naming the first thing missing or refused.
    pub fn check() -> Result<(), NetBedError> {
        let euid = effective_uid()?;
        if euid != 0 {
            return Err(NetBedError::NotRoot { euid });
        }
        for (program, package) in PROGRAMS {
            if !on_path(program) {
                return Err(NetBedError::MissingProgram { program, package });
            }
        }
        run("unshare", ["--net", "--mount", "--uts", "true"])
    }

    /// The bed's hosts, in the order of their names given to [`NetBed::new`].
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host named `name`.
    ///
    /// # Panics
    ///
    /// Panics when the bed has no such host, naming the hosts it has.
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|host| host.name == name)
            .unwrap_or_else(|| {
                let names: Vec<&str> = self.hosts.iter().map(|host| host.name.as_str()).collect();
                panic!(
                    "netbed {}: no host {name:?}; its hosts: {names:?}",
                    self.index
                )
            })
    }

    /// The address of the host named `name`.
    ///
    /// # Panics
    ///
    /// Panics when the bed has no such host.
    pub fn address(&self, name: &str) -> Ipv4Addr {
        self.host(name).address
    }

    /// The test's own address on the bed (its root leg): hosts reach the test process there.
    pub fn root_address(&self) -> Ipv4Addr {
        address(self.index, 1)
    }

    /// A directory at the same path in the test and on every host, removed with the bed.
    ///
    /// It lies under `/run`, a small tmpfs on many machines. Every directory outside `/tmp` and
    /// `/dev/shm` is shared with the hosts likewise: large data can go in a temporary directory
    /// under the test's target directory (`CARGO_TARGET_TMPDIR`).
    pub fn shared_dir(&self) -> PathBuf {
        self.directory.join("shared")
    }

    /// The caller's directories under `/tmp` and `/dev/shm` that every host sees at the same path
    /// (see [the module](self)).
    pub fn caller_dirs(&self) -> &[PathBuf] {
        &self.caller_dirs
    }

    /// The bed's index, which names its namespaces, interfaces and directory (see [the module](self)).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The bed's directory under `/run/sluice-netbed`.
    pub fn directory(&self) -> &Path {
        &self.directory
    }
}

impl Drop for NetBed {
    fn drop(&mut self) {
        let problems = tear_down(self.index);
        if problems.is_empty() {
            return;
        }
        let message = format!(
            "netbed {}: teardown left {}",
            self.index,
            problems.join("; ")
        );
        if std::thread::panicking() {
            eprintln!("{message}");
        } else {
            panic!("{message}");
        }
    }
}

impl Host {
    /// The host's name: its hostname, and its name in every host's `/etc/hosts`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's address on the bed.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// A command that runs `program` on this host, ready to spawn like any [`Command`].
    ///
    /// It is `nsenter` entering the host's namespaces, which then executes `program`, so the child's
    /// pid is the program's. The program inherits the test's environment; its working directory is
    /// the bed's shared directory, and [`Command::current_dir`] has no effect on it, because
    /// entering a mount namespace moves the working directory to its root (use `sh -c 'cd DIR &&
    /// ...'` to run elsewhere).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(prefixed(
                "--net=",
                Path::new(NETNS_DIRECTORY).join(&self.netns).as_os_str(),
            ))
            .arg(prefixed("--mount=", self.mount_namespace.as_os_str()))
            .arg(prefixed("--uts=", self.uts_namespace.as_os_str()))
            .arg(prefixed("--wd=", self.shared_dir.as_os_str()))
            .arg("--")
            .arg(program);
        command
    }

    /// Unplugs the host's cable at the switch: the host keeps its address, but nothing it sends
    /// arrives and nothing reaches it, so connections to and from it time out rather than being
    /// refused. Processes on the host keep running.
    ///
    /// # Panics
    ///
    /// Panics when `ip` fails, with what it printed.
    pub fn link_down(&self) {
        self.set_link("down");
    }

    /// Plugs the host's cable back in after [`Host::link_down`].
    ///
    /// # Panics
    ///
    /// Panics when `ip` fails, with what it printed.
    pub fn link_up(&self) {
        self.set_link("up");
    }

    /// Kills every process running on the host with SIGKILL, and waits until they are gone.
    ///
    /// # Panics
    ///
    /// Panics when some of them are still there after ten seconds.
    pub fn kill_all(&self) {
        let namespaces = [
            namespace_identity(&Path::new(NETNS_DIRECTORY).join(&self.netns)),
            namespace_identity(&self.mount_namespace),
        ];
        if let Err(problem) = kill_processes_in(&namespaces.into_iter().flatten().collect()) {
            panic!("netbed host {}: {problem}", self.name);
        }
    }

    /// The bed's shared directory.
    pub(crate) fn shared_dir(&self) -> &Path {
        &self.shared_dir
    }

    /// Makes the host's network namespace and cable, and its mount and UTS namespaces, into whose
    /// private mounts it carries `caller_dirs`.
    fn build(&self, bed_directory: &Path, caller_dirs: &[PathBuf]) -> Result<(), NetBedError> {
        let cidr = format!("{}/24", self.address);
        run("ip", ["netns", "add", &self.netns])?;
        run("ip", ["-n", &self.netns, "link", "set", "lo", "up"])?;
        run(
            "ip",
            [
                "-n",
                &self.switch_netns,
                "link",
                "add",
                &self.switch_leg,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &self.netns,
            ],
        )?;
        run(
            "ip",
            [
                "-n",
                &self.switch_netns,
                "link",
                "set",
                &self.switch_leg,
                "master",
                "br0",
                "up",
            ],
        )?;
        run(
            "ip",
            ["-n", &self.netns, "addr", "add", &cidr, "dev", "eth0"],
        )?;
        run("ip", ["-n", &self.netns, "link", "set", "eth0", "up"])?;

        for path in [&self.mount_namespace, &self.uts_namespace] {
            File::create(path).map_err(|source| NetBedError::Io {
                path: path.clone(),
                source,
            })?;
        }
        let carry = bed_directory.join("carry").join(&self.name);
        std::fs::create_dir_all(&carry).map_err(|source| NetBedError::Io {
            path: carry.clone(),
            source,
        })?;
        // The caller's directories under the private mounts are bound on `carry/<n>` first, and
        // moved onto their own paths once the private mounts hide them. Then the mounts copied from
        // the test's namespace that would keep other beds' namespaces alive go: `ip netns`'s and
        // the other beds' directories. Another bed's directory may go meanwhile, its mount with
        // it: failing to unmount it is a failure only if it is still mounted. The arguments: the
        // hosts file, the hostname, the beds' directory, this bed's directory, the carrying
        // directory, then the caller's directories.
        let script = r#"set -e
hosts=$1 name=$2 beds=$3 own=$4 carry=$5
shift 5
n=0
for dir in "$@"; do
    mkdir -p "$carry/$n"
    mount --bind "$dir" "$carry/$n"
    n=$((n + 1))
done
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
n=0
for dir in "$@"; do
    mkdir -p "$dir"
    mount --move "$carry/$n" "$dir"
    n=$((n + 1))
done
set -- "$hosts" "$name" "$beds" "$own"
mount --bind "$1" /etc/hosts
echo "$2" > /proc/sys/kernel/hostname
while mountpoint -q /run/netns; do umount -l /run/netns; done
for bed in "$3"/*/; do
    bed=${bed%/}
    if [ "$bed" != "$4" ] && mountpoint -q "$bed"; then
        umount -l "$bed" 2>/dev/null || ! mountpoint -q "$bed"
    fi
done
"#;
        run(
            "unshare",
            [
                prefixed("--mount=", self.mount_namespace.as_os_str()),
                prefixed("--uts=", self.uts_namespace.as_os_str()),
                "--propagation".into(),
                "private".into(),
                "--".into(),
                "sh".into(),
                "-c".into(),
                script.into(),
                "sh".into(),
                bed_directory.join("hosts").into_os_string(),
                self.name.clone().into(),
                BEDS_DIRECTORY.into(),
                bed_directory.as_os_str().to_owned(),
                carry.into_os_string(),
            ]
            .into_iter()
            .chain(caller_dirs.iter().map(|dir| dir.as_os_str().to_owned())),
        )
    }

    fn set_link(&self, state: &str) {
        if let Err(error) = run(
            "ip",
            [
                "-n",
                &self.switch_netns,
                "link",
                "set",
                &self.switch_leg,
                state,
            ],
        ) {
            panic!("netbed host {}: link {state}: {error}", self.name);
        }
    }
}

/// The directories of the caller to carry into the hosts' private mounts: of the running program's
/// target directory, the checkout it was built from (`CARGO_MANIFEST_DIR`, which cargo sets for the
/// tests it runs) and the directories on `PATH`, the directory directly under a private mount that
/// holds each; and each of `given`, as it is. None holds another.
fn caller_dirs(given: &[&Path]) -> Result<Vec<PathBuf>, NetBedError> {
    let mut dirs = Vec::new();
    for dir in given {
        let canonical = dir.canonicalize().map_err(|source| NetBedError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        if !canonical.is_dir() {
            return Err(NetBedError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::other("not a directory: give the bed directories to share"),
            });
        }
        if under_private_mount(&canonical).is_some() {
            dirs.push(canonical);
        }
    }
    let mut own: Vec<PathBuf> = std::env::current_exe()
        .ok()
        .and_then(|program| target_directory(&program))
        .into_iter()
        .collect();
    own.extend(std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from));
    if let Some(paths) = std::env::var_os("PATH") {
        own.extend(std::env::split_paths(&paths));
    }
    dirs.extend(
        own.iter()
            .filter_map(|path| path.canonicalize().ok())
            .filter_map(|path| under_private_mount(&path)),
    );
    Ok(outermost(dirs))
}

/// The target directory holding `program`: the nearest directory above it with cargo's
/// [`TARGET_DIRECTORY_TAG`], else the program's own directory.
fn target_directory(program: &Path) -> Option<PathBuf> {
    let directory = program.parent()?;
    Some(
        directory
            .ancestors()
            .find(|ancestor| ancestor.join(TARGET_DIRECTORY_TAG).is_file())
            .unwrap_or(directory)
            .to_path_buf(),
    )
}

/// The directory directly under one of [`PRIVATE_MOUNTS`] that holds `path`, or `path` itself when
/// it is one; `None` when it lies under none, or is one of them.
fn under_private_mount(path: &Path) -> Option<PathBuf> {
    PRIVATE_MOUNTS.iter().find_map(|mount| {
        let first = path.strip_prefix(mount).ok()?.components().next()?;
        Some(Path::new(mount).join(first))
    })
}

/// `dirs` without repeats and without those inside another, in order.
fn outermost(mut dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    dirs.sort();
    dirs.dedup();
    let mut kept: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        if !kept.iter().any(|outer| dir.starts_with(outer)) {
            kept.push(dir);
        }
    }
    kept
}

/// Makes the directory, switch, root leg and hosts of the bed `index`, and returns its hosts, each
/// carrying `caller_dirs` into its private mounts.
fn build(index: u32, names: &[&str], caller_dirs: &[PathBuf]) -> Result<Vec<Host>, NetBedError> {
    let directory = bed_directory(index);
    for path in [
        directory.clone(),
        directory.join("ns"),
        directory.join("shared"),
    ] {
        std::fs::create_dir_all(&path).map_err(|source| NetBedError::Io { path, source })?;
    }
    // A namespace can be bound to a file only where mounts do not propagate.
    run(
        "mount",
        [
            OsStr::new("--bind"),
            directory.as_os_str(),
            directory.as_os_str(),
        ],
    )?;
    run(
        "mount",
        [OsStr::new("--make-private"), directory.as_os_str()],
    )?;
    write_file(
        &directory.join("owner"),
        &format!("{}\n", std::process::id()),
    )?;
    let mut hosts_file =
        String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    for (ordinal, name) in names.iter().enumerate() {
        hosts_file.push_str(&format!("{}\t{name}\n", host_address(index, ordinal)));
    }
    write_file(&directory.join("hosts"), &hosts_file)?;

    let switch = switch_netns(index);
    let root_leg = root_leg(index);
    run("ip", ["netns", "add", &switch])?;
    run("ip", ["-n", &switch, "link", "set", "lo", "up"])?;
    run(
        "ip",
        ["-n", &switch, "link", "add", "br0", "type", "bridge"],
    )?;
    run("ip", ["-n", &switch, "link", "set", "br0", "up"])?;
    run(
        "ip",
        [
            "link", "add", &root_leg, "type", "veth", "peer", "name", "root", "netns", &switch,
        ],
    )?;
    run(
        "ip",
        ["-n", &switch, "link", "set", "root", "master", "br0", "up"],
    )?;
    let root_cidr = format!("{}/24", address(index, 1));
    run("ip", ["addr", "add", &root_cidr, "dev", &root_leg])?;
    run("ip", ["link", "set", &root_leg, "up"])?;

    let mut hosts = Vec::new();
    for (ordinal, name) in names.iter().enumerate() {
        let host = Host {
            name: (*name).to_owned(),
            address: host_address(index, ordinal),
            netns: format!("{NETNS_PREFIX}{index}-{name}"),
            mount_namespace: directory.join("ns").join(format!("{name}.mnt")),
            uts_namespace: directory.join("ns").join(format!("{name}.uts")),
            switch_netns: switch.clone(),
            switch_leg: format!("h{ordinal}"),
            shared_dir: directory.join("shared"),
        };
        host.build(&directory, caller_dirs)?;
        hosts.push(host);
    }
    Ok(hosts)
}

/// Fails unless every name is a valid host name, used once, and there are as many as a bed holds.
fn check_names(names: &[&str]) -> Result<(), NetBedError> {
    let invalid = |name: &str, reason| NetBedError::HostName {
        name: name.to_owned(),
        reason,
    };
    if names.is_empty() || names.len() > MAX_HOSTS {
        return Err(invalid(
            &names.join(","),
            "list is empty or longer than 253 hosts",
        ));
    }
    let mut seen = BTreeSet::new();
    for name in names {
        if name.is_empty() || name.len() > 63 {
            return Err(invalid(name, "is empty or longer than 63 characters"));
        }
        if !name.starts_with(|first: char| first.is_ascii_lowercase()) || name.ends_with('-') {
            return Err(invalid(
                name,
                "does not start with a letter or ends with '-'",
            ));
        }
        if !name.chars().all(|character| {
            character.is_ascii_lowercase() || character.is_ascii_digit() || character == '-'
        }) {
            return Err(invalid(name, "has characters other than a-z, 0-9 and '-'"));
        }
        if *name == "localhost" || !seen.insert(*name) {
            return Err(invalid(name, "is localhost or given twice"));
        }
    }
    Ok(())
}

/// The directory of the bed `index`.
fn bed_directory(index: u32) -> PathBuf {
    Path::new(BEDS_DIRECTORY).join(index.to_string())
}

/// The name of the switch's network namespace of the bed `index`.
fn switch_netns(index: u32) -> String {
    format!("{NETNS_PREFIX}{index}_switch")
}

/// The name of the root leg of the bed `index`, in the test's network namespace.
fn root_leg(index: u32) -> String {
    format!("{ROOT_LEG_PREFIX}{index}")
}

/// The address `last` of the subnet of the bed `index`.
fn address(index: u32, last: u8) -> Ipv4Addr {
    let third = u8::try_from(index).expect("a bed index is below 256");
    Ipv4Addr::new(SUBNET_OCTETS[0], SUBNET_OCTETS[1], third, last)
}

/// The address of the host `ordinal` of the bed `index`.
fn host_address(index: u32, ordinal: usize) -> Ipv4Addr {
    let last = u8::try_from(ordinal + 2).expect("a bed has at most 253 hosts");
    address(index, last)
}

/// Takes the lowest index whose lock is free and whose subnet is routed nowhere; returns it with
/// its lock, held.
fn claim_index() -> Result<(u32, File), NetBedError> {
    let mut reasons = Vec::new();
    for index in 0..MAX_BEDS {
        let Some(lock) = try_lock(index)? else {
            continue;
        };
        // A bed that died since the sweep.
        let problems = tear_down(index);
        if !problems.is_empty() {
            reasons.push(format!("bed {index}: {}", problems.join(", ")));
            continue;
        }
        match routed(index)? {
            Some(route) => reasons.push(format!("10.147.{index}.0/24 is routed already: {route}")),
            None => return Ok((index, lock)),
        }
    }
    if reasons.is_empty() {
        reasons.push(format!("all {MAX_BEDS} beds are in use"));
    }
    Err(NetBedError::NoFreeIndex {
        reasons: reasons.join("; "),
    })
}

/// The lock of the bed `index`, when no other bed holds it.
fn try_lock(index: u32) -> Result<Option<File>, NetBedError> {
    let path = Path::new(BEDS_DIRECTORY).join(format!("{index}.lock"));
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| NetBedError::Io {
            path: path.clone(),
            source,
        })?;
    match lock.try_lock() {
        Ok(()) => Ok(Some(lock)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(source)) => Err(NetBedError::Io { path, source }),
    }
}

/// Tears down every bed whose remains are there but whose lock no live process holds.
fn sweep_stale_beds() -> Result<(), NetBedError> {
    let mut indexes = BTreeSet::new();
    for name in directory_names(Path::new(BEDS_DIRECTORY)) {
        indexes.extend(name.parse::<u32>());
    }
    for name in directory_names(Path::new(NETNS_DIRECTORY)) {
        // "sluice-netbed-<index>-<host>" or "sluice-netbed-<index>_switch".
        let index = name
            .strip_prefix(NETNS_PREFIX)
            .and_then(|rest| rest.split(['-', '_']).next());
        indexes.extend(index.and_then(|index| index.parse::<u32>().ok()));
    }
    let links = output("ip", ["-o", "link", "show"])?;
    for line in links.lines() {
        // "7: snb3@if6: <BROADCAST,...": the name ends at '@' or ':'.
        let index = line
            .split(": ")
            .nth(1)
            .and_then(|name| name.split('@').next())
            .and_then(|name| name.strip_prefix(ROOT_LEG_PREFIX));
        indexes.extend(index.and_then(|index| index.parse::<u32>().ok()));
    }
    for index in indexes.into_iter().filter(|index| *index < MAX_BEDS) {
        if let Some(_lock) = try_lock(index)? {
            let problems = tear_down(index);
            if !problems.is_empty() {
                return Err(NetBedError::Stale {
                    index,
                    problems: problems.join("; "),
                });
            }
        }
    }
    Ok(())
}

/// Tears down whatever is left of the bed `index`: the processes on its hosts, its mounts, network
/// namespaces and root leg, its directory. Returns what it could not remove.
fn tear_down(index: u32) -> Vec<String> {
    let mut problems = Vec::new();
    let directory = bed_directory(index);
    let netns_names: Vec<String> = directory_names(Path::new(NETNS_DIRECTORY))
        .into_iter()
        .filter(|name| {
            name == &switch_netns(index) || name.starts_with(&format!("{NETNS_PREFIX}{index}-"))
        })
        .collect();
    let mut namespaces: BTreeSet<(u64, u64)> = netns_names
        .iter()
        .filter_map(|name| namespace_identity(&Path::new(NETNS_DIRECTORY).join(name)))
        .collect();
    namespaces.extend(
        directory_names(&directory.join("ns"))
            .into_iter()
            .filter_map(|name| namespace_identity(&directory.join("ns").join(name))),
    );
    if let Err(problem) = kill_processes_in(&namespaces) {
        problems.push(problem);
    }
    // Deepest first, the bed's directory last.
    let mut mounts = mount_points_under(&directory);
    mounts.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    for point in mounts {
        if let Err(error) = run("umount", [OsStr::new("-l"), point.as_os_str()]) {
            problems.push(error.to_string());
        }
    }
    // The root leg before the switch: a switch's namespace goes in the background once deleted, and
    // its end of the leg with it, which would leave the name taken a while.
    let leg = root_leg(index);
    let leg_exists = || run("ip", ["link", "show", "dev", &leg]).is_ok();
    if leg_exists()
        && let Err(error) = run("ip", ["link", "delete", "dev", &leg])
        && leg_exists()
    {
        problems.push(error.to_string());
    }
    for name in &netns_names {
        if let Err(error) = run("ip", ["netns", "delete", name]) {
            problems.push(error.to_string());
        }
    }
    if directory.exists()
        && let Err(error) = std::fs::remove_dir_all(&directory)
    {
        problems.push(format!("removing {}: {error}", directory.display()));
    }
    problems
}

/// The mount points at or under `directory`, from this process's mount table.
fn mount_points_under(directory: &Path) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|point| point.starts_with(directory))
        .collect()
}

/// The device and inode of the namespace at `path` (a `/proc/PID/ns/*` link or a file a namespace is
/// bound to), which identify it.
fn namespace_identity(path: &Path) -> Option<(u64, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.dev(), metadata.ino()))
}

/// The processes other than this one whose network or mount namespace is one of `namespaces`.
fn processes_in(namespaces: &BTreeSet<(u64, u64)>) -> Vec<u32> {
    let own = std::process::id();
    directory_names(Path::new("/proc"))
        .into_iter()
        .filter_map(|name| name.parse::<u32>().ok())
        .filter(|pid| *pid != own)
        .filter(|pid| {
            ["net", "mnt"].iter().any(|kind| {
                namespace_identity(Path::new(&format!("/proc/{pid}/ns/{kind}")))
                    .is_some_and(|identity| namespaces.contains(&identity))
            })
        })
        .collect()
}

/// Kills the processes in `namespaces` with SIGKILL until none is left, or fails after the watchdog.
fn kill_processes_in(namespaces: &BTreeSet<(u64, u64)>) -> Result<(), String> {
    if namespaces.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    loop {
        // A killed process no longer has namespaces once it is a zombie, reaped or not.
        let pids = processes_in(namespaces);
        if pids.is_empty() {
            return Ok(());
        }
        if started.elapsed() > KILL_WATCHDOG {
            return Err(format!(
                "processes {pids:?} still run {KILL_WATCHDOG:?} after SIGKILL"
            ));
        }
        // A process may end between the scan and the kill: kill's failure is not checked, the next
        // scan is.
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(pids.iter().map(u32::to_string))
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first route of the test's namespace, in any table, whose destination overlaps the subnet of
/// the bed `index`.
fn routed(index: u32) -> Result<Option<String>, NetBedError> {
    let routes = output("ip", ["-4", "-o", "route", "show", "table", "all"])?;
    Ok(routes
        .lines()
        .find(|route| overlaps_subnet(route, index))
        .map(str::to_owned))
}

/// Whether the route `route`, a line of `ip -o route`, leads to an address of the subnet of the bed
/// `index`; default routes aside, which lead everywhere.
fn overlaps_subnet(route: &str, index: u32) -> bool {
    const ROUTE_TYPES: [&str; 10] = [
        "unicast",
        "local",
        "broadcast",
        "multicast",
        "throw",
        "unreachable",
        "prohibit",
        "blackhole",
        "nat",
        "anycast",
    ];
    // "[TYPE] PREFIX ...", the prefix an address with or without its length.
    let mut words = route.split_whitespace();
    let Some(mut destination) = words.next() else {
        return false;
    };
    if ROUTE_TYPES.contains(&destination) {
        let Some(next) = words.next() else {
            return false;
        };
        destination = next;
    }
    let (network, length) = destination.split_once('/').unwrap_or((destination, "32"));
    let (Ok(network), Ok(length)) = (network.parse::<Ipv4Addr>(), length.parse::<u32>()) else {
        return false;
    };
    let shorter = length.min(24);
    if shorter == 0 {
        return false;
    }
    let mask = u32::MAX << (32 - shorter);
    u32::from(network) & mask == u32::from(address(index, 0)) & mask
}

/// The effective user id of this process.
fn effective_uid() -> Result<u32, NetBedError> {
    let path = PathBuf::from("/proc/self/status");
    let status = std::fs::read_to_string(&path).map_err(|source| NetBedError::Io {
        path: path.clone(),
        source,
    })?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
        .ok_or_else(|| NetBedError::Io {
            path,
            source: std::io::Error::other("no effective uid on its Uid: line"),
        })
}

/// Whether `program` is an executable file in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|directory| directory.join(program).is_file())
    })
}

/// The names of the entries of `directory`; none when it cannot be read.
fn directory_names(directory: &Path) -> Vec<String> {
    std::fs::read_dir(directory)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `text` to `path`.
fn write_file(path: &Path, text: &str) -> Result<(), NetBedError> {
    File::create(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|source| NetBedError::Io {
            path: path.to_owned(),
            source,
        })
}

/// `prefix` followed by `value`.
fn prefixed(prefix: &str, value: &OsStr) -> OsString {
    let mut joined = OsString::from(prefix);
    joined.push(value);
    joined
}

/// Runs `program` with `arguments` to its end; an error carries its command line and what it printed.
fn run<I, S>(program: &str, arguments: I) -> Result<(), NetBedError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    output(program, arguments).map(drop)
}

/// Runs `program` with `arguments` to its end and returns its standard output.
fn output<I, S>(program: &str, arguments: I) -> Result<String, NetBedError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let arguments: Vec<OsString> = arguments
        .into_iter()
        .map(|argument| argument.as_ref().to_owned())
        .collect();
    let command = std::iter::once(program.to_owned())
        .chain(
            arguments
                .iter()
                .map(|argument| argument.to_string_lossy().into_owned()),
        )
        .collect::<Vec<_>>()
        .join(" ");
    let result = Command::new(program)
        .args(&arguments)
        .stdin(Stdio::null())
        .output();
    let output = match result {
        Ok(output) => output,
        Err(error) => {
            return Err(NetBedError::Failed {
                command,
                stderr: error.to_string(),
            });
        }
    };
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    let refused = ["Operation not permitted", "Permission denied"]
        .iter()
        .any(|sign| stderr.contains(sign));
    if refused {
        Err(NetBedError::Refused { command, stderr })
    } else {
        Err(NetBedError::Failed { command, stderr })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_must_be_host_names_used_once() {
        assert!(check_names(&["am", "n1", "s3", "node-2"]).is_ok());
        for bad in [
            &[][..],
            &["N1"],
            &["1n"],
            &["n-"],
            &["n_1"],
            &["localhost"],
            &["n1", "n1"],
        ] {
            assert!(
                matches!(check_names(bad), Err(NetBedError::HostName { .. })),
                "{bad:?} is refused"
            );
        }
        let long = "a".repeat(64);
        assert!(check_names(&[&long]).is_err());
    }

    #[test]
    fn a_subnet_is_taken_by_the_routes_that_overlap_it() {
        for route in [
            "10.147.3.0/24 dev snb3 proto kernel scope link src 10.147.3.1",
            "local 10.147.3.1 dev snb3 table local proto kernel scope host src 10.147.3.1",
            "10.147.0.0/16 via 192.0.2.1 dev eth0",
            "10.0.0.0/8 dev tun0",
            "blackhole 10.147.3.128/25",
        ] {
            assert!(overlaps_subnet(route, 3), "{route}");
        }
        for route in [
            "default via 10.147.3.1 dev eth0",
            "0.0.0.0/0 dev eth0",
            "10.147.4.0/24 dev snb4 proto kernel scope link src 10.147.4.1",
            "broadcast 10.147.2.255 dev snb2 table local",
            "192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2",
        ] {
            assert!(!overlaps_subnet(route, 3), "{route}");
        }
    }

    #[test]
    fn the_callers_directories_under_private_mounts_are_carried_outermost_first() {
        assert_eq!(
            under_private_mount(Path::new("/tmp/clone/target/debug")),
            Some(PathBuf::from("/tmp/clone"))
        );
        assert_eq!(
            under_private_mount(Path::new("/dev/shm/t")),
            Some(PathBuf::from("/dev/shm/t"))
        );
        assert_eq!(under_private_mount(Path::new("/tmp")), None);
        assert_eq!(under_private_mount(Path::new("/work/target")), None);
        assert_eq!(under_private_mount(Path::new("/tmpfoo/x")), None);
        assert_eq!(
            outermost(vec![
                PathBuf::from("/tmp/b/c"),
                PathBuf::from("/tmp/a"),
                PathBuf::from("/tmp/b"),
                PathBuf::from("/tmp/a"),
                PathBuf::from("/tmp/bc"),
            ]),
            vec![
                PathBuf::from("/tmp/a"),
                PathBuf::from("/tmp/b"),
                PathBuf::from("/tmp/bc")
            ]
        );
    }

    #[test]
    fn a_programs_target_directory_is_the_one_cargo_tagged() {
        let root = tempfile::tempdir().expect("tempdir");
        let deps = root.path().join("target/debug/deps");
        std::fs::create_dir_all(&deps).expect("mkdir");
        let program = deps.join("netbed-0123");
        assert_eq!(target_directory(&program), Some(deps.clone()), "untagged");
        std::fs::write(root.path().join("target").join(TARGET_DIRECTORY_TAG), "")
            .expect("write the tag");
        assert_eq!(target_directory(&program), Some(root.path().join("target")));
    }

    #[test]
    fn every_bed_and_host_has_its_own_address() {
        assert_eq!(address(7, 1), Ipv4Addr::new(10, 147, 7, 1));
        assert_eq!(host_address(7, 0), Ipv4Addr::new(10, 147, 7, 2));
        assert_eq!(host_address(255, 252), Ipv4Addr::new(10, 147, 255, 254));
        assert!(
            root_leg(MAX_BEDS - 1).len() <= 15,
            "interface names have 15 bytes at most"
        );
    }
}
