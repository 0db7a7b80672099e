"""The checkpoint calls over TLS: a trainer reaches an AM that serves TLS with only ``SLUICE_AM``,
``SLUICE_TLS_CA`` and ``SLUICE_TOKEN``, and a CA that did not sign the AM's certificate is named."""

from __future__ import annotations

import os

import pytest

import sluice
from conftest import write_tls_files

TOKEN = "python-tls-token"


def test_a_trainer_commits_a_checkpoint_over_tls_and_a_wrong_ca_is_named(make_job, tmp_path, monkeypatch):
    tls = write_tls_files(tmp_path)
    job = make_job("tls", rows=2000, task_rows=500, batch_size=250)
    job.start_am("--token", TOKEN, "--tls-cert", str(tls["server"]), "--tls-key", str(tls["server-key"]))
    port = job.am_address.rsplit(":", 1)[1]
    env = dict(os.environ, SLUICE_TOKEN=TOKEN, SLUICE_TLS_CA=str(tls["ca"]))
    daemon = job.start_daemon_with(env, "--am", f"https://localhost:{port}")
    for name, value in job.trainer_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLUICE_AM", f"localhost:{port}")
    monkeypatch.setenv("SLUICE_TOKEN", TOKEN)
    monkeypatch.setenv("SLUICE_TLS_CA", str(tls["ca"]))
    reader = sluice.Reader()
    next(iter(reader))
    state = reader.state_dict()
    assert state["token"].startswith("tls-step")

    monkeypatch.setenv("SLUICE_TLS_CA", str(tls["other-ca"]))
    with pytest.raises(sluice.SluiceError, match="SLUICE_TLS_CA"):
        reader.state_dict()
    reader.close()
    daemon.kill()
