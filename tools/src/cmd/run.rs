//! `sluice run` and `sluice submit`: a job's AM with its executors launched on this machine.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::ValueEnum as _;
use sluice_am::launcher::Launcher;
use sluice_am::launcher::local::{LAUNCH_MARK, LocalLauncher};
use sluice_am::launcher::slurm::{Allocation, SlurmLauncher};
use sluice_am::server::{AmOptions, LaunchOptions};
use sluice_am::spec::{JobSpec, LauncherKind};
use sluice_kube::launcher::KubernetesLauncher;

use crate::cmd::am::{Serving, TlsArgs, serve_job};
use crate::cmd::{slurm, token};

/// Arguments of `sluice run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The job spec (YAML, TOML or JSON); without one, the quickstart: a generated sample dataset
    /// read by two node daemons and four reference trainers.
    pub job: Option<PathBuf>,
    /// The address of the AM's gRPC API.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Where the executors run, in place of the spec's `launcher.kind`: `slurm` runs them as steps
    /// of the Slurm allocation `sluice run` runs in.
    #[arg(long, value_enum)]
    pub launcher: Option<SubmitLauncher>,
    #[command(flatten)]
    pub options: JobOptions,
}

/// What `sluice run` and `sluice submit` share: where rings and state go, access, restore and the
/// status page.
#[derive(Debug, clap::Args)]
pub struct JobOptions {
    /// The directory rings are created under, one subdirectory per job (default:
    /// /dev/shm/sluice-<uid>, this user's own).
    #[arg(long, default_value_os_t = sluice_ring::default_ring_dir())]
    pub ring_dir: PathBuf,
    /// Serve trainers that run as other users of GROUP: the daemons make the rings 0660 and their
    /// directories 0770, of that group (by default they are this user's alone: 0600 and 0700).
    #[arg(long, value_name = "GROUP")]
    pub shared_group: Option<String>,
    /// The size of each trainer's ring in bytes (a multiple of 4096); the node daemons reserve it
    /// in the ring directory's filesystem when they create the ring.
    #[arg(long, default_value_t = sluice_ring::DEFAULT_CAPACITY)]
    pub ring_size: u64,
    /// Where executors' state and logs are kept (default: <temp dir>/sluice-<uid>/<job>, this
    /// user's own).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// A shared token every caller of the AM must present.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Reset the job to this data checkpoint before it runs.
    #[arg(long)]
    pub resume_from: Option<String>,
    /// The address of the status page, its JSON API and Prometheus /metrics (port 0: any free
    /// port; the page's URL is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub http: SocketAddr,
    /// The address executors on other hosts reach the AM at (HOST:PORT); by default the --listen
    /// address, or this host's name when it listens on every address.
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,
    /// The CA that signed --tls-cert, handed to the executors (`SLUICE_TLS_CA`) so that they
    /// check the AM's certificate.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl JobOptions {
    /// The options as `sluice run` arguments, but for the token, which goes in `SLUICE_TOKEN` so that
    /// it does not show in the process list.
    fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--ring-dir".into(),
            self.ring_dir.clone().into(),
            "--ring-size".into(),
            self.ring_size.to_string().into(),
            "--http".into(),
            self.http.to_string().into(),
        ];
        if let Some(state_dir) = &self.state_dir {
            args.extend(["--state-dir".into(), state_dir.clone().into()]);
        }
        if let Some(group) = &self.shared_group {
            args.extend(["--shared-group".into(), group.into()]);
        }
        if let Some(checkpoint) = &self.resume_from {
            args.extend(["--resume-from".into(), checkpoint.into()]);
        }
        if let Some(advertise) = &self.advertise {
            args.extend(["--advertise".into(), advertise.into()]);
        }
        let files = [
            ("--tls-ca", &self.tls_ca),
            ("--tls-cert", &self.tls.tls_cert),
            ("--tls-key", &self.tls.tls_key),
            ("--tls-client-ca", &self.tls.tls_client_ca),
        ];
        for (flag, file) in files {
            if let Some(file) = file {
                args.extend([flag.into(), absolute(file).into()]);
            }
        }
        if self.tls.insecure {
            args.push("--insecure".into());
        }
        args
    }

    /// Where the executors' state and logs of job `name` go.
    fn state_dir_of(&self, name: &str) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir()
                .join(format!("sluice-{}", sluice_ring::files::user()))
                .join(name)
        })
    }
}

/// Runs a job to its end with the launcher its spec (or `--launcher`) names: processes on this
/// machine, steps of the Slurm allocation it runs in, or pods from the AM's pod on Kubernetes;
/// exits non-zero when the job fails.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let spec = match &args.job {
        Some(job) => JobSpec::from_path(job)?,
        None => quickstart()?,
    };
    if spec.launcher == LauncherKind::External {
        anyhow::bail!(
            "job {}: its spec says `launcher: {{ kind: external }}`, so nothing here launches its daemons and trainers; serve it with `sluice am {}`, start `sluice daemon --am ADDR` on each node and the trainers with torchrun or srun and SLUICE_AM=ADDR (or set `launcher: local` to run it all here)",
            spec.name,
            args.job
                .as_ref()
                .map_or_else(|| "JOB.yaml".to_owned(), |job| job.display().to_string())
        );
    }
    let kind = args.launcher.map_or(spec.launcher, SubmitLauncher::kind);
    if args.options.tls.tls_client_ca.is_some() {
        anyhow::bail!(
            "job {}: --tls-client-ca asks every daemon for a client certificate, which the executors `sluice run` launches do not have; leave it out (the job's token still guards the AM)",
            spec.name
        );
    }
    let runtime = sluice_am::server::runtime().context("starting the AM's runtime")?;
    let state_dir = args.options.state_dir_of(&spec.name);
    let mut sluice = std::env::current_exe().context("locating the sluice binary")?;
    // A trainer must never find a finished ring of an earlier run and take it for its data: rings
    // that no live process uses are removed before anything is launched.
    let job_rings = args.options.ring_dir.join(&spec.name);
    sluice_ring::gc::collect(&job_rings)
        .with_context(|| format!("collecting dead rings in {}", job_rings.display()))?;
    // Every job gets a token: one given, or the one made for it (kept in its state directory, so
    // that an AM started again has the token its running executors hold; on Kubernetes, in a
    // Secret of the job).
    let mut made_token = args.options.token.is_none();
    let (launcher, token): (Arc<dyn Launcher>, String) = match kind {
        LauncherKind::Kubernetes => {
            if args.options.token.is_some() {
                anyhow::bail!(
                    "job {}: on Kubernetes the job's token is kept in its Secret, which the node pods read; leave --token out",
                    spec.name
                );
            }
            let (launcher, token) =
                runtime.block_on(KubernetesLauncher::connect(&spec, args.options.ring_size))?;
            // The node pods' image has `sluice` on its PATH.
            sluice = PathBuf::from("sluice");
            made_token = false;
            (Arc::new(launcher), token)
        }
        LauncherKind::Slurm => {
            let gpus = spec
                .roles
                .iter()
                .map(|role| (role.name.clone(), role.resources.gpu))
                .collect();
            let local = LocalLauncher::new(&state_dir, &sluice)?;
            let launcher = SlurmLauncher::new(local, Allocation::from_env()?, &spec.name, gpus);
            (
                Arc::new(launcher),
                job_token(args.options.token, &state_dir)?,
            )
        }
        LauncherKind::Local | LauncherKind::External => (
            Arc::new(LocalLauncher::new(&state_dir, &sluice)?),
            job_token(args.options.token, &state_dir)?,
        ),
    };
    let options = AmOptions {
        listen: args.listen,
        token: Some(token),
        resume_from: args.options.resume_from,
        launch: Some(LaunchOptions {
            launcher,
            sluice,
            ring_dir: args.options.ring_dir,
            shared_group: args.options.shared_group,
            ring_size: args.options.ring_size,
            tls_ca: args.options.tls_ca.clone(),
        }),
        tls: args.options.tls.server_tls(),
        insecure: args.options.tls.insecure,
        advertise: args.options.advertise,
    };
    let notes = [format!("executor logs in {}", state_dir.display())];
    let served = runtime.block_on(serve_job(
        spec,
        options,
        Serving {
            label: "sluice run",
            http: Some(args.options.http),
            notes: &notes,
            progress: true,
            publish_token: made_token,
            // In its pod, a signal is Kubernetes moving the AM: the AM its Job starts again takes
            // the job over.
            stop_on_signal: kind != LauncherKind::Kubernetes,
        },
    ));
    if kind != LauncherKind::Kubernetes {
        remove_rings(&job_rings);
    }
    served.map_err(|error| {
        let mut message = format!("{error:#}");
        for (executor, last_error) in executor_errors(&message, &state_dir) {
            message.push_str(&format!("\n  {executor}'s last error: {last_error}"));
        }
        anyhow::anyhow!(message)
    })
}

/// How long the job's processes have, once its AM is done, to be gone before their rings are
/// left to `sluice gc`.
const RINGS_GONE_WITHIN: Duration = Duration::from_secs(5);

/// Removes the job's rings once the processes that used them are gone, and their directory once
/// empty; a ring still in use after [`RINGS_GONE_WITHIN`] is left, and said so.
fn remove_rings(job_rings: &Path) {
    let started = Instant::now();
    loop {
        match sluice_ring::gc::collect(job_rings) {
            Ok(report) if report.kept.is_empty() => {
                // Left empty: it goes too. Anything else in it stays, as `sluice gc` leaves it.
                let _ = std::fs::remove_dir(job_rings);
                return;
            }
            Ok(report) if started.elapsed() > RINGS_GONE_WITHIN => {
                eprintln!(
                    "sluice run: {} ring(s) under {} are still in use by live processes; `sluice gc` removes them once those are gone",
                    report.kept.len(),
                    job_rings.display()
                );
                return;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(100)),
            Err(error) => {
                eprintln!(
                    "sluice run: removing the rings under {}: {error}",
                    job_rings.display()
                );
                return;
            }
        }
    }
}

/// The token given, or the one made for the job whose state directory is `state_dir`.
fn job_token(given: Option<String>, state_dir: &Path) -> anyhow::Result<String> {
    match given {
        Some(token) => Ok(token),
        None => token::for_job(state_dir),
    }
}

/// The last error that each executor a failed job's message names (`<executor> failed ...`) wrote
/// to its log in `state_dir`, so that the message tells why, not only that, it failed.
fn executor_errors(message: &str, state_dir: &Path) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return Vec::new();
    };
    let mut found: Vec<(String, String)> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
        .filter_map(|path| {
            let executor = path.file_stem()?.to_str()?.to_owned();
            if !message.contains(&format!("{executor} failed")) {
                return None;
            }
            let log = std::fs::read_to_string(&path).ok()?;
            last_error(&log).map(|error| (executor, error))
        })
        .collect();
    found.sort();
    found
}

/// The error a `sluice` executor's last launch ended with (`error: ...`, causes included).
fn last_error(log: &str) -> Option<String> {
    log.lines()
        .rev()
        .take_while(|line| !line.starts_with(LAUNCH_MARK))
        .find_map(|line| line.strip_prefix("error: "))
        .map(str::to_owned)
}

/// Rows of the quickstart's sample dataset.
const QUICKSTART_ROWS: u64 = 2_000_000;

/// The quickstart job, `examples/quickstart.yaml`: the sample dataset, generated once into
/// `~/.cache/sluice/quickstart`, read by two node daemons into four `sluice consume` trainers.
fn quickstart() -> anyhow::Result<JobSpec> {
    let home = std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .context("the quickstart keeps its sample dataset under $HOME/.cache; set HOME")?;
    let data = PathBuf::from(home)
        .join(".cache/sluice/quickstart")
        .join(format!("data-{QUICKSTART_ROWS}"));
    if !data.join("_SUCCESS").exists() {
        println!(
            "sluice run: generating the sample dataset ({QUICKSTART_ROWS} rows) in {}",
            data.display()
        );
        if data.exists() {
            std::fs::remove_dir_all(&data)
                .with_context(|| format!("removing a partial dataset at {}", data.display()))?;
        }
        crate::cmd::r#gen::generate_parquet(&data, QUICKSTART_ROWS, 8, 65_536)?;
        std::fs::write(data.join("_SUCCESS"), b"")?;
    }
    Ok(JobSpec::parse(
        include_str!("../../../examples/quickstart.yaml"),
        sluice_am::spec::Format::Yaml,
    )?)
}

/// Where `sluice submit` and `sluice run` run the job's executors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SubmitLauncher {
    /// Processes on this machine.
    Local,
    /// One pod per node.
    Kubernetes,
    /// Steps of a Slurm allocation.
    Slurm,
}

impl SubmitLauncher {
    fn kind(self) -> LauncherKind {
        match self {
            SubmitLauncher::Local => LauncherKind::Local,
            SubmitLauncher::Kubernetes => LauncherKind::Kubernetes,
            SubmitLauncher::Slurm => LauncherKind::Slurm,
        }
    }
}

/// Arguments of `sluice submit`.
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// The job spec (YAML, TOML or JSON).
    pub job: PathBuf,
    /// Where the job runs, in place of the spec's `launcher.kind`. Outside a Slurm allocation,
    /// `slurm` hands the job to `sbatch`; inside one, the AM runs here and uses it.
    #[arg(long, value_enum)]
    pub launcher: Option<SubmitLauncher>,
    /// The address of the AM's gRPC API.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// Print the batch script that would go to `sbatch`, and submit nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub options: JobOptions,
}

/// Starts a job in the background: `sluice run` on this machine, printing the AM's address once
/// it serves, or, with the Slurm launcher outside an allocation, a batch job that runs it.
pub fn submit(args: SubmitArgs) -> anyhow::Result<()> {
    let spec = JobSpec::from_path(&args.job)?;
    let kind = args.launcher.map_or(spec.launcher, SubmitLauncher::kind);
    let in_allocation = std::env::var_os("SLURM_JOB_ID").is_some();
    if kind == LauncherKind::Slurm && (!in_allocation || args.dry_run) {
        let sluice = std::env::current_exe().context("locating the sluice binary")?;
        let mut run_args: Vec<std::ffi::OsString> = vec![
            absolute(&args.job).into(),
            "--launcher".into(),
            "slurm".into(),
            "--listen".into(),
            args.listen.to_string().into(),
        ];
        run_args.extend(args.options.to_args());
        let script =
            slurm::batch_script(&spec, &absolute(&sluice), &run_args, args.options.ring_size);
        if args.dry_run {
            print!("{script}");
            return Ok(());
        }
        return slurm::sbatch(&spec.name, &script, args.options.token.as_deref());
    }
    if args.dry_run {
        anyhow::bail!(
            "--dry-run shows the batch script of the Slurm launcher; job {} runs with the {kind:?} launcher",
            spec.name
        );
    }
    if kind == LauncherKind::Kubernetes {
        anyhow::bail!(
            "job {}: on Kubernetes the job runs from its objects: `sluice manifests {} | kubectl apply -f -`",
            spec.name,
            args.job.display()
        );
    }
    if kind == LauncherKind::External {
        anyhow::bail!(
            "job {}: under `launcher: {{ kind: external }}` nothing is launched; serve it with `sluice am {}`",
            spec.name,
            args.job.display()
        );
    }
    let state_dir = args.options.state_dir_of(&spec.name);
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let log_path = state_dir.join("am.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let sluice = std::env::current_exe().context("locating the sluice binary")?;
    let mut command = Command::new(sluice);
    command
        .arg("run")
        .arg(&args.job)
        .arg("--listen")
        .arg(args.listen.to_string())
        .args(args.options.to_args());
    if let Some(launcher) = args.launcher {
        command.arg("--launcher").arg(
            launcher
                .to_possible_value()
                .expect("no variant is skipped")
                .get_name(),
        );
    }
    match &args.options.token {
        Some(token) => command.env("SLUICE_TOKEN", token),
        None => command.env_remove("SLUICE_TOKEN"),
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting sluice run")?;
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(line) = text.lines().find(|line| line.contains("serving on")) {
            println!("{}", line.replacen("sluice run", "sluice submit", 1));
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("job {} did not start ({status}):\n{text}", spec.name);
        }
        if started.elapsed() > Duration::from_secs(120) {
            anyhow::bail!(
                "job {} did not start serving within 120 s; see {}",
                spec.name,
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `path` made absolute against the working directory, for a command that runs elsewhere.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_error_of_a_log_is_found() {
        let log = format!(
            "{LAUNCH_MARK}daemon-1\nerror: an old failure\nsome output\nerror: ring /dev/shm/j/1.ring: no room\n"
        );
        assert_eq!(
            last_error(&log).as_deref(),
            Some("ring /dev/shm/j/1.ring: no room")
        );
        let relaunched = format!("{log}{LAUNCH_MARK}daemon-1\nall went well\n");
        assert_eq!(last_error(&relaunched), None, "only the last launch counts");
    }

    #[test]
    fn only_the_executors_a_failure_names_are_read() {
        let directory = tempfile::tempdir().expect("tempdir");
        std::fs::write(directory.path().join("daemon-1.log"), "error: no room\n").expect("log");
        std::fs::write(directory.path().join("daemon-10.log"), "error: other\n").expect("log");
        std::fs::write(directory.path().join("daemon-1.exit"), "error: not a log\n").expect("exit");
        let found = executor_errors("daemon-1 failed 3 times (last exit: 1)", directory.path());
        assert_eq!(found, vec![("daemon-1".to_owned(), "no room".to_owned())]);
    }
}
