"""`sluice.torch.Dataset` against a real AM and node daemon (`scripts/test.sh` installs torch)."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

import sluice
from sluice.torch import Dataset


def test_items_are_tensors_over_the_ring_and_every_row_arrives_once(make_job):
    job = make_job("torch", rows=3000)
    job.start()
    dataset = Dataset(str(job.ring), am=job.am_address, rank=0, world_size=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0)
    start, end = dataset.reader.data_region()
    ids = []
    for step, item in enumerate(loader):
        assert isinstance(item["id"], torch.Tensor) and item["id"].dtype == torch.int64
        assert start <= item["id"].data_ptr() < end, "the id tensor points into the ring"
        ids.extend(item["id"].tolist())
        if step == 3:
            state = dataset.checkpoint()
            assert state["step"] == 4 and isinstance(state["token"], str)
    assert sorted(ids) == list(range(job.rows))


def test_load_state_dict_before_the_first_item_restores_the_step(make_job):
    job = make_job("torch-state", rows=1000)
    job.start()
    first = sluice.Reader(str(job.ring), am=job.am_address, rank=0, world_size=1)
    next(iter(first))
    state = first.state_dict()
    del first
    dataset = Dataset(str(job.ring), am=job.am_address, rank=0, world_size=1)
    dataset.load_state_dict(state)
    assert dataset.reader.step == state["step"]


def test_float_nulls_become_nan_and_integer_nulls_name_the_fill_null_transform():
    from sluice.torch import to_tensors

    batch = pa.RecordBatch.from_pydict(
        {"x": pa.array([1.5, None, -2.0], pa.float32()), "n": pa.array([1, 2, 3], pa.int64())}
    )
    item = to_tensors(batch)
    assert item["x"].dtype == torch.float32
    assert item["x"][0].item() == 1.5 and item["x"][2].item() == -2.0
    assert torch.isnan(item["x"][1]).item()
    assert item["n"].tolist() == [1, 2, 3]

    with_null = pa.RecordBatch.from_pydict({"n": pa.array([1, None], pa.int64())})
    with pytest.raises(sluice.SluiceError, match=r"column 'n' \(int64\) has 1 nulls.*fill_null: \{column: n, value: 0\}"):
        to_tensors(with_null)


def test_a_boolean_column_becomes_a_bool_tensor_and_one_with_nulls_stays_arrow():
    from sluice.torch import to_tensors

    batch = pa.RecordBatch.from_pydict(
        {"_sluice_pad": pa.array([False, True, True]), "maybe": pa.array([True, None, False])}
    )
    item = to_tensors(batch)
    assert item["_sluice_pad"].dtype == torch.bool
    assert item["_sluice_pad"].tolist() == [False, True, True]
    assert isinstance(item["maybe"], pa.Array)
