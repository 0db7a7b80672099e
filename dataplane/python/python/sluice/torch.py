"""``sluice.torch.Dataset``: the ring as a ``torch.utils.data.IterableDataset`` of dicts of tensors.

Importing this module needs torch; importing ``sluice`` does not.

Each item is one batch: a dict from column name to a tensor. An integer or floating-point column
without nulls becomes a tensor over the ring's memory through DLPack, with no
copy; a floating-point column with nulls becomes a tensor over one copy with NaN for the nulls; an
integer column with nulls is an error (fill them with the job's ``fill_null`` transform); any other
column (strings, lists) stays a ``pyarrow.Array``. As with :class:`sluice.Reader`, an item's batch is
released when the next item is asked for: its zero-copy tensors may then show the ring's later bytes,
so ``clone()`` what must outlive the step. (Releasing only once the tensors are garbage would stall at
the end of the data: a training loop still holds its last item when it asks for the next.)

Use it with ``DataLoader(dataset, batch_size=None)`` (the ring's batches are already batches), and
``num_workers=0``: the ring has one reader, in the process that opened it.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import IterableDataset

from sluice import Reader, SluiceError

__all__ = ["Dataset", "to_tensors"]


def to_tensors(batch: pa.RecordBatch) -> Dict[str, Any]:
    """The columns of ``batch`` as tensors, without copying where the type allows (see the module)."""
    item: Dict[str, Any] = {}
    for name, column in zip(batch.schema.names, batch.columns):
        kind = column.type
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            if column.null_count == 0:
                item[name] = torch.from_dlpack(column)
            elif pa.types.is_floating(kind):
                # One vectorised copy with NaN for the nulls, then the copy's memory through DLPack.
                item[name] = torch.from_dlpack(pc.fill_null(column, float("nan")))
            else:
                raise SluiceError(
                    f"column {name!r} ({kind}) has {column.null_count} nulls in this batch, and an integer tensor has no "
                    f"null: fill them in the job spec (data.transforms: [{{fill_null: {{column: {name}, value: 0}}}}]) "
                    "or read the batches with sluice.Reader"
                )
        else:
            item[name] = column
    return item


class Dataset(IterableDataset):
    """An ``IterableDataset`` over one rank's ring, with the reader's ``state_dict`` and
    ``load_state_dict`` (see :class:`sluice.Reader`, whose arguments it takes)."""

    def __init__(self, ring: Optional[str] = None, **reader_options: Any) -> None:
        super().__init__()
        self._ring = ring
        self._options = reader_options
        self._reader: Optional[Reader] = None
        self._pending_state: Optional[Dict[str, Any]] = None

    @property
    def reader(self) -> Reader:
        """The reader, opened on first use."""
        if self._reader is None:
            self._reader = Reader(self._ring, **self._options)
            if self._pending_state is not None:
                self._reader.load_state_dict(self._pending_state)
                self._pending_state = None
        return self._reader

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 0:
            raise SluiceError("sluice.torch.Dataset reads its ring in the process that opened it: use DataLoader(..., num_workers=0)")
        reader = self.reader
        for batch in reader:
            yield to_tensors(batch)

    def state_dict(self, step: Optional[int] = None) -> Dict[str, Any]:
        return self.reader.state_dict(step)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if self._reader is None:
            self._pending_state = state
        else:
            self._reader.load_state_dict(state)
