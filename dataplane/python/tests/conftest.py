"""Real processes for the tests: the `sluice` binary, generated data, `sluice am` and `sluice daemon`.

The binary is `$SLUICE_BIN`, or `sluice` under `$CARGO_TARGET_DIR` (the workspace's `target/` when
unset), built with cargo when it is missing.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
WATCHDOG_S = 120


def _sluice_binary() -> pathlib.Path:
    explicit = os.environ.get("SLUICE_BIN")
    if explicit:
        return pathlib.Path(explicit)
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    binary = target / "debug" / "sluice"
    if not binary.exists():
        subprocess.run(["cargo", "build", "-p", "sluice-cli", "--bin", "sluice"], cwd=ROOT, check=True)
    return binary


@pytest.fixture(scope="session")
def sluice_bin() -> pathlib.Path:
    binary = _sluice_binary()
    assert binary.exists(), f"no sluice binary at {binary}: build it with `cargo build -p sluice-cli` or set SLUICE_BIN"
    return binary


def generate(sluice_bin: pathlib.Path, data: pathlib.Path, rows: int) -> None:
    """Writes `rows` generated rows (ids 0 to rows - 1) into `data`: two Parquet files of row groups
    of 500 rows."""
    subprocess.run(
        [str(sluice_bin), "gen", "--out", str(data), "--rows", str(rows), "--files", "2", "--row-group-rows", "500"],
        check=True,
        stdout=subprocess.DEVNULL,
    )


class Job:
    """A generated dataset, its job spec, and the AM and daemon serving it."""

    def __init__(
        self,
        sluice_bin: pathlib.Path,
        root: pathlib.Path,
        name: str,
        rows: int,
        task_rows: int,
        batch_size: int,
        epochs: int = 1,
        ring_size: int = 8 << 20,
        world_size: int = 1,
    ):
        self.sluice_bin = sluice_bin
        self.root = root
        self.name = name
        self.rows = rows
        self.ring_size = ring_size
        self.world_size = world_size
        self.data = root / "data"
        self.rings = root / "rings"
        self.processes: List[subprocess.Popen] = []
        generate(sluice_bin, self.data, rows)
        self.spec = root / "job.yaml"
        self.spec.write_text(
            f"""
name: {name}
data:
  sources: [{{ uri: "file://{self.data}", format: parquet }}]
  task_rows: {task_rows}
  batch_size: {batch_size}
  epochs: {epochs}
nodes: 1
roles:
  - {{ name: worker, num: {world_size}, command: [python3, train.py] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{root / 'ckpt'}" }}
"""
        )
        self.am_address: Optional[str] = None

    @property
    def ring(self) -> pathlib.Path:
        return self.rings / self.name / "0.ring"

    def trainer_env(self, rank: int = 0) -> Dict[str, str]:
        env = dict(os.environ)
        env.pop("SLUICE_TOKEN", None)
        env.update(
            SLUICE_RING=str(self.rings / self.name / f"{rank}.ring"),
            SLUICE_AM=self.am_address or "",
            SLUICE_RANK=str(rank),
            SLUICE_WORLD_SIZE=str(self.world_size),
        )
        return env

    def start_am(self, *extra: str) -> subprocess.Popen:
        env = dict(os.environ)
        env.pop("SLUICE_TOKEN", None)
        am = subprocess.Popen(
            [str(self.sluice_bin), "am", str(self.spec), "--listen", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.processes.append(am)
        line = am.stdout.readline()
        assert " serving on " in line, f"expected the AM's address, got {line!r}"
        self.am_address = line.strip().rsplit(" ", 1)[-1]
        return am

    def start_daemon(self) -> subprocess.Popen:
        env = dict(os.environ)
        env.pop("SLUICE_TOKEN", None)
        return self.start_daemon_with(env, "--am", self.am_address)

    def start_daemon_with(self, env: Dict[str, str], *arguments: str) -> subprocess.Popen:
        """Starts `sluice daemon ARGUMENTS` with `env`, on the job's ring directory."""
        daemon = subprocess.Popen(
            [str(self.sluice_bin), "daemon", *arguments, "--ring-dir", str(self.rings), "--ring-size", str(self.ring_size)],
            env=env,
        )
        self.processes.append(daemon)
        return daemon

    def start(self) -> None:
        self.start_am()
        self.start_daemon()

    def status(self) -> dict:
        output = subprocess.run(
            [str(self.sluice_bin), "status", "--json", "--am", self.am_address],
            check=True,
            capture_output=True,
            text=True,
        )
        return json.loads(output.stdout)

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=WATCHDOG_S)
        self.processes = []

    def expected_table(self):
        import pyarrow.parquet as pq

        return pq.read_table(self.data).sort_by("id")


@pytest.fixture
def make_job(sluice_bin, tmp_path):
    jobs: List[Job] = []

    def make(
        name: str,
        rows: int = 6000,
        task_rows: int = 1000,
        batch_size: int = 250,
        epochs: int = 1,
        ring_size: int = 8 << 20,
        world_size: int = 1,
    ) -> Job:
        job = Job(sluice_bin, tmp_path, name, rows, task_rows, batch_size, epochs, ring_size, world_size)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.kill_all()


# The S3 server of the tests, as the Rust test kit runs it (tests/testkit/src/lib.rs).
S3_PORT = 8333
S3_BUCKET = "sluice-test"
S3_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "sluice-access",
    "AWS_SECRET_ACCESS_KEY": "sluice-secret",
    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{S3_PORT}",
    "AWS_ALLOW_HTTP": "true",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """SeaweedFS's ``weed mini`` serving S3 on 127.0.0.1 with the bucket ``S3_BUCKET``: yields the
    environment that reaches it (``S3_ENVIRONMENT``)."""
    import pyarrow.fs

    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", S3_PORT)) != 0, f"port {S3_PORT} is in use: stop the other S3 server first"
    directory = tmp_path_factory.mktemp("seaweed")
    env = dict(os.environ, S3_BUCKET=S3_BUCKET, **S3_ENVIRONMENT)
    with open(directory / "weed.log", "w") as log:
        server = subprocess.Popen(
            [
                "weed", "mini", f"-dir={directory / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-admin.ui=false", "-master.telemetry=false",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        store = pyarrow.fs.S3FileSystem(
            access_key=S3_ENVIRONMENT["AWS_ACCESS_KEY_ID"],
            secret_key=S3_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"],
            endpoint_override=f"127.0.0.1:{S3_PORT}",
            scheme="http",
            region="us-east-1",
        )

        def bucket_ready() -> bool:
            assert server.poll() is None, f"weed exited: {(directory / 'weed.log').read_text()[-2000:]}"
            try:
                return store.get_file_info(S3_BUCKET).type == pyarrow.fs.FileType.Directory
            except OSError:
                return False

        wait_until(bucket_ready, "the S3 server's bucket", timeout_s=60.0)
        yield dict(S3_ENVIRONMENT)
    finally:
        server.kill()
        server.wait()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serving_address(process: subprocess.Popen) -> str:
    """The address ``sluice run`` prints first that its AM serves on."""
    line = process.stdout.readline()
    assert " serving on " in line, f"expected the AM's address, got {line!r}"
    return line.rsplit(" serving on ", 1)[1].split()[0]


def am_status(sluice_bin: pathlib.Path, address: str, env: Dict[str, str]) -> dict:
    """``sluice status --json`` of the AM at ``address``; empty once it no longer answers."""
    shown = subprocess.run(
        [str(sluice_bin), "status", "--am", address, "--json"], env=env, capture_output=True, text=True, timeout=WATCHDOG_S
    )
    return json.loads(shown.stdout) if shown.returncode == 0 else {}


def sluice_run(
    sluice_bin: pathlib.Path, tmp_path: pathlib.Path, spec, env: Dict[str, str], cwd=None
) -> subprocess.CompletedProcess:
    """Runs the job ``spec`` with ``sluice run`` (its rings and executors' state under ``tmp_path``,
    without the caller's ``SLUICE_TOKEN``) and asserts that it succeeded."""
    env = dict(env)
    env.pop("SLUICE_TOKEN", None)
    run = subprocess.run(
        [
            str(sluice_bin), "run", str(spec), "--listen", "127.0.0.1:0",
            "--ring-dir", str(tmp_path / "rings"), "--state-dir", str(tmp_path / "state"),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=WATCHDOG_S,
    )
    assert run.returncode == 0, f"sluice run failed: {run.stderr[-4000:]}"
    return run


def run_example(sluice_bin: pathlib.Path, tmp_path: pathlib.Path, spec: str, env: Dict[str, str], ranks: int) -> List[dict]:
    """Runs ``examples/SPEC`` with ``sluice run`` from the repository's root, as the example's
    comment does, and returns the JSON lines its trainers of role ``trainer``, ranks 0 to
    ``ranks - 1``, printed."""
    sluice_run(sluice_bin, tmp_path, f"examples/{spec}", env, cwd=ROOT)
    state = tmp_path / "state"
    return [
        json.loads(line)
        for rank in range(ranks)
        for line in (state / f"trainer-trainer-{rank}.log").read_text().splitlines()
        if line.startswith("{")
    ]


def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    """Polls ``condition`` until it holds; fails naming ``what`` after the deadlock watchdog's time."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"waited {timeout_s} s for {what}: deadlock watchdog"
        time.sleep(0.02)


def run_python(script: str, env: Dict[str, str], *arguments: str) -> subprocess.Popen:
    """Starts ``script`` in a new Python interpreter (a trainer process), with ``arguments`` as its
    ``sys.argv[1:]``."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *arguments], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def write_tls_files(directory: pathlib.Path) -> Dict[str, pathlib.Path]:
    """A CA and a server certificate it signed for localhost and 127.0.0.1, made with the openssl
    command (./scripts/test.sh installs it), and a second CA that signed nothing."""
    def run(*arguments: str) -> None:
        subprocess.run(["openssl", *arguments], check=True, cwd=directory, capture_output=True)

    for name in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.pem", "-subj", f"/CN=sluice test {name}", "-days", "2")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost")
    (directory / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem",
        "-days", "2", "-extfile", "san.ext")
    return {name: directory / f"{name}.pem" for name in ("ca", "other-ca", "server")} | {"server-key": directory / "server.key"}
