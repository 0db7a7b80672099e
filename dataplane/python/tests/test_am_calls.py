"""The checkpoint calls to the AM, as JSON over HTTP on its API port: answers, refusals and an AM that is
not there."""

from __future__ import annotations

import socket

import pytest

import sluice
from sluice._am import commit_data_checkpoint, restore_data_checkpoint


def test_an_am_that_is_not_there_is_named_with_the_fix():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(sluice.SluiceError, match=f"cannot reach the AM at {address}: .*check SLUICE_AM and that the AM runs"):
        commit_data_checkpoint(address, None, 1, 0, 1, 0, [], 5.0)
    with pytest.raises(sluice.SluiceError, match="AM address 'ftp://host:1': expected host:port or an http:// URL; check SLUICE_AM"):
        restore_data_checkpoint("ftp://host:1", None, "t", 0, 5.0)


def test_the_am_refuses_a_call_without_its_token_and_answers_one_with_it(make_job):
    job = make_job("tokened")
    job.start_am("--token", "s3cret")
    with pytest.raises(sluice.SluiceError, match=f"the AM at {job.am_address} refused the data checkpoint of step 1: .*SLUICE_TOKEN"):
        commit_data_checkpoint(job.am_address, None, 1, 0, 1, 0, [], 5.0)
    with pytest.raises(sluice.SluiceError, match="refused the data checkpoint of step 1: .*SLUICE_TOKEN"):
        commit_data_checkpoint(job.am_address, "wrong", 1, 0, 1, 0, [], 5.0)

    token = commit_data_checkpoint(f"http://{job.am_address}", "s3cret", 1, 0, 1, 0, [], 5.0)
    assert token.startswith("tokened-step1-")
    assert restore_data_checkpoint(job.am_address, "s3cret", token, 0, 5.0) == "rings_replaced"
    with pytest.raises(sluice.SluiceError, match="refused the restore of data checkpoint tokened-step9-0: data checkpoint tokened-step9-0 is not in"):
        restore_data_checkpoint(job.am_address, "s3cret", "tokened-step9-0", 0, 5.0)


def test_a_commit_that_other_ranks_never_join_times_out_naming_the_ranks(make_job):
    job = make_job("alone")
    job.start_am()
    with pytest.raises(sluice.SluiceError, match="data checkpoint of step 3: 1 of 2 ranks reported after .* every rank must call state_dict"):
        commit_data_checkpoint(job.am_address, None, 3, 0, 2, 0, [], 0.2)
