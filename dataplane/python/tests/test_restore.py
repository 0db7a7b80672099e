"""A trainer killed alone under `sluice run` and relaunched: it loads its last saved state and the AM
restarts every trainer from that data checkpoint, so every row is trained on exactly once across the
kill (the rows trained up to the checkpoint in the first life, then the rows after it)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

from conftest import WATCHDOG_S, generate, wait_until

# The trainer: reads paced batches, saves {state, ids} atomically every CHECKPOINT_EVERY batches,
# and at the end writes the ids loaded from its saved state and the ids it read after loading.
TRAINER = r"""
import json, os, sys, time
import sluice

out = sys.argv[1]
rank = int(os.environ["SLUICE_RANK"])
state_path = os.path.join(out, f"state-{rank}.json")


def write_atomically(path, value):
    temporary = path + ".tmp"
    with open(temporary, "w") as file:
        json.dump(value, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


reader = sluice.Reader()
restored = []
if os.path.exists(state_path):
    with open(state_path) as file:
        saved = json.load(file)
    reader.load_state_dict(saved["state"])
    restored = saved["ids"]
write_atomically(os.path.join(out, f"pid-{rank}.json"), {"pid": os.getpid(), "resumed": bool(restored)})
after = []
for batch in reader:
    after.extend(batch.column("id").to_pylist())
    time.sleep(0.05)
    if reader.step % 3 == 0:
        state = reader.state_dict()
        write_atomically(state_path, {"state": state, "ids": restored + after})
write_atomically(os.path.join(out, f"final-{rank}.json"), {"restored": restored, "after": after})
"""


def read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_a_trainer_killed_alone_resumes_from_its_last_checkpoint_with_every_row_once(sluice_bin, tmp_path):
    rows = 6000
    data = tmp_path / "data"
    generate(sluice_bin, data, rows)
    out = tmp_path / "out"
    out.mkdir()
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"""
name: restore-{os.getpid()}
data:
  sources: [{{ uri: "file://{data}", format: parquet }}]
  task_rows: 1000
  batch_size: 250
nodes: 1
roles:
  - {{ name: worker, num: 1, command: ["{sys.executable}", "{trainer}", "{out}"] }}
failover: {{ restart: on-failure, heartbeat_interval_ms: 50, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{tmp_path / 'ckpt'}" }}
"""
    )
    env = dict(os.environ)
    env.pop("SLUICE_TOKEN", None)
    run = subprocess.Popen(
        [
            str(sluice_bin), "run", str(spec), "--listen", "127.0.0.1:0",
            "--ring-dir", str(tmp_path / "rings"), "--state-dir", str(tmp_path / "state"),
            "--ring-size", str(8 << 20),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = run.stdout.readline()
        assert " serving on " in line, f"expected the AM's address, got {line!r}"
        # The rest of the output is drained, so the run never blocks on a full pipe.
        threading.Thread(target=run.stdout.read, daemon=True).start()
        stderr = []
        threading.Thread(target=lambda: stderr.append(run.stderr.read()), daemon=True).start()

        state_path = out / "state-0.json"

        def checkpointed_twice():
            saved = read_json(state_path)
            return saved is not None and saved["state"]["step"] >= 6

        wait_until(checkpointed_twice, "the trainer's second checkpoint", timeout_s=WATCHDOG_S)
        first = read_json(out / "pid-0.json")
        assert first is not None and not first["resumed"], first
        os.kill(first["pid"], signal.SIGKILL)

        def resumed_life():
            life = read_json(out / "pid-0.json")
            return life is not None and life["resumed"]

        wait_until(resumed_life, "a relaunched trainer reading after load_state_dict", timeout_s=WATCHDOG_S)
        assert run.wait(timeout=WATCHDOG_S) == 0, f"sluice run failed: {''.join(stderr)[-4000:]}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=WATCHDOG_S)

    final = read_json(out / "final-0.json")
    assert final is not None, "the last trainer wrote what it trained on"
    restored, after = final["restored"], final["after"]
    assert len(restored) >= 6 * 250, "the state of the second checkpoint or a later one was loaded"
    assert not set(restored) & set(after), "rows trained before the checkpoint came again"
    assert len(after) == len(set(after)), "rows came twice after the restart"
    assert sorted(restored + after) == list(range(rows)), "every row exactly once across the kill"
    lives = json.loads((out / "pid-0.json").read_text())
    assert lives["pid"] != first["pid"], "the trainer that finished is a relaunched one"
