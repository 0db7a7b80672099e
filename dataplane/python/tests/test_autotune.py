"""The daemon tunes its reading at run time: a trainer that reads slowly, then not at all, then as
fast as it can. While it is paced the daemon's rings stay full and it gives back decode parallelism
and read-ahead down to one task at a time; while it reads nothing the daemon burns next to no CPU;
once it reads freely the parallelism comes back to the cap. Every row is delivered once throughout.
The daemon's choices are read from its Prometheus `/metrics`."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import urllib.request

import numpy
import sluice

from conftest import ROOT, WATCHDOG_S, am_status, free_port, serving_address, wait_until

ROWS = 1_000_000



def metric(url: str, name: str, kind: str) -> float:
    text = urllib.request.urlopen(url, timeout=WATCHDOG_S).read().decode()
    found = re.search(rf'^sluice_daemon_{name}{{node="\d+",kind="{kind}"}} (\S+)$', text, re.MULTILINE)
    assert found, f"no {name} {kind} in {text}"
    return float(found.group(1))


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_daemon_gives_back_parallelism_to_a_slow_trainer_idles_with_an_idle_one_and_takes_it_again(make_job):
    job = make_job("autotune", rows=ROWS, task_rows=100_000, batch_size=1000, ring_size=4 << 20)
    job.spec.write_text(job.spec.read_text() + "daemon: { max_threads: 2 }\n")
    job.start_am()
    port = free_port()
    env = dict(os.environ)
    env.pop("SLUICE_TOKEN", None)
    daemon = job.start_daemon_with(env, "--am", job.am_address, "--http", f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"
    wait_until(lambda: job.ring.exists(), "the ring", timeout_s=WATCHDOG_S)
    reader = sluice.Reader(str(job.ring), am=job.am_address, rank=0, world_size=1)
    batches = iter(reader)
    ids = []

    def read(count: int, pause_s: float) -> None:
        for _ in range(count):
            batch = next(batches)
            ids.append(batch.column("id").to_numpy().copy())
            del batch
            time.sleep(pause_s)

    cap = metric(url, "decode_threads", "max")
    assert cap == 2, f"the job's cap within the host's 2 cores: {cap}"
    # Paced: a batch every 20 ms, far below what the daemon reads, so its ring stays full.
    started = time.monotonic()
    while metric(url, "decode_threads", "tuned") > 1:
        assert time.monotonic() - started < WATCHDOG_S, "the parallelism never came down for a paced trainer"
        read(10, 0.02)
    assert metric(url, "read_ahead_bytes", "tuned") < metric(url, "read_ahead_bytes", "max")
    # The AM shows the daemon's choices from its heartbeats.
    wait_until(
        lambda: (job.status()["nodes"][0]["tuning"] or {}).get("threads") == 1,
        "the AM's status showing one task read at a time",
        timeout_s=WATCHDOG_S,
    )
    assert job.status()["nodes"][0]["tuning"]["max_threads"] == cap

    # Not reading at all: the daemon waits on its full ring and does next to nothing.
    before = cpu_seconds(daemon.pid)
    time.sleep(2.0)
    idle = cpu_seconds(daemon.pid) - before
    assert idle < 0.2, f"the daemon of an idle trainer used {idle:.2f} s of CPU in 2 s"

    # Free: the trainer reads as fast as it can; the parallelism comes back to the cap.
    highest = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                highest.append(metric(url, "decode_threads", "tuned"))
            except OSError:
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for batch in batches:
        ids.append(batch.column("id").to_numpy().copy())
        del batch
    done.set()
    watcher.join(timeout=WATCHDOG_S)
    assert max(highest) == cap, f"the parallelism came back to {max(highest)} of {cap} for a free trainer"
    delivered = numpy.sort(numpy.concatenate(ids))
    assert numpy.array_equal(delivered, numpy.arange(ROWS)), "every row once"


def test_the_tuned_example_reads_one_task_at_a_time_for_its_paced_trainer(sluice_bin, tmp_path):
    """`examples/tuned.yaml`, as its comment runs it, on fewer rows."""
    data = tmp_path / "data"
    subprocess.run(
        [str(sluice_bin), "gen", "--out", str(data), "--rows", "600000", "--files", "4", "--row-group-rows", "50000"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    env = dict(os.environ, SLUICE_EXAMPLE_DATA=str(data))
    env.pop("SLUICE_TOKEN", None)
    run = subprocess.Popen(
        [
            str(sluice_bin), "run", "examples/tuned.yaml", "--listen", "127.0.0.1:0",
            "--ring-dir", str(tmp_path / "rings"), "--state-dir", str(tmp_path / "state"),
            "--ring-size", str(4 << 20),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = serving_address(run)

        def paced_node_tuning() -> dict:
            nodes = am_status(sluice_bin, address, env).get("nodes", [])
            return next((node["tuning"] or {} for node in nodes), {})

        def tuned_down() -> bool:
            assert run.poll() is None, "the job ended before the daemon read one task at a time"
            return paced_node_tuning().get("threads") == 1

        wait_until(tuned_down, "the daemon reading one task at a time", WATCHDOG_S)
        assert paced_node_tuning()["max_threads"] == 2
        _, stderr = run.communicate(timeout=WATCHDOG_S)
        assert run.returncode == 0, f"sluice run failed: {stderr[-4000:]}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=WATCHDOG_S)
