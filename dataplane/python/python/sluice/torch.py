"""``sluice.torch.Dataset``: the ring as a ``torch.utils.data.IterableDataset`` of dicts of tensors.

Importing this module needs torch; importing ``sluice`` does not.

Each item is one batch: a dict from column name to a tensor. An integer or floating-point column
without nulls becomes a tensor over the ring's memory through DLPack, with no
copy; a floating-point column with nulls becomes a tensor over one copy with NaN for the nulls; an
integer column with nulls is an error (fill them with the job's ``fill_null`` transform); a boolean
column without nulls becomes a ``torch.bool`` tensor over one copy (Arrow packs booleans in bits), so
``_sluice_pad`` (``data.even_batches: pad``) masks a loss as it is; any other column (strings, lists,
booleans with nulls) stays a ``pyarrow.Array``.

Use it with ``DataLoader(dataset, batch_size=None)`` or torchdata's
``StatefulDataLoader(dataset, batch_size=None)`` (the ring's batches are already batches), and
``num_workers=0``: the ring has one reader, in the process that opened it.

**Lifetime of an item.** As with :class:`sluice.Reader`, an item's batch is released when the next
item is asked for: its zero-copy tensors may then show the ring's later bytes, so ``clone()`` what
must outlive the step. (Releasing only once the tensors are garbage would stall at the end of the
data: a training loop still holds its last item when it asks for the next.) A loader that fetches
one item ahead of the one it hands the loop, as Accelerate's and Lightning's do, releases the item
in use that way: give such a loop ``Dataset(keep_batches=2)``, which keeps the batches of the last
two items. When the daemon has published nothing more, the kept batches are released before the
dataset waits (the daemon may need their room, and the AM ends an epoch only once every row of it is
consumed): their ring tensors are first copied in place (``Tensor.set_``), so the tensors the loop
holds keep their values, though views taken of them before do not, nor do ``pyarrow.Array`` columns.

**Checkpoints.** ``Dataset`` follows the ``Stateful`` protocol of ``torch.distributed.checkpoint``
and of torchdata's ``StatefulDataLoader``. :meth:`Dataset.state_dict` costs no call to the AM: it
notes the position of every item the dataset has yielded (an item the loader holds counts as
consumed), and its ``"token"`` is a :class:`PendingToken`. The commit to the AM (the one of
:meth:`sluice.Reader.state_dict`, which waits for every rank of the step) happens when the state is
pickled, as ``torch.save`` does, or when :func:`commit` or :meth:`Dataset.checkpoint` is called.
So a loader that asks for the state at every step (``StatefulDataLoader`` under Accelerate) costs a
snapshot per step, and the AM hears of the checkpoints that are saved::

    loader = StatefulDataLoader(Dataset(), batch_size=None)
    for step, item in enumerate(loader):
        train(item)
        if step % 1000 == 0:
            torch.save(loader.state_dict(), path)    # commits the data checkpoint
    ...
    loader.load_state_dict(torch.load(path))         # in a new process: exactly the rest

A commit that fails (the AM refuses it, or a rank does not commit the step in time) raises from the
pickling, after ``torch.save`` opened its file: save to a new name and rename it to keep the
previous file whole.

Every rank must commit the step. A framework that asks every rank for its state but writes only rank
0's file (Lightning's checkpoints, Accelerate's ``register_for_checkpointing``) pickles nothing on
the other ranks: commit on every rank when it asks, with :func:`commit` (``commit(state)`` returns
the state with the token committed) or :meth:`Dataset.checkpoint`. Any rank's state resumes the job
at any world size (see :meth:`sluice.Reader.load_state_dict`), and the state holds nothing of one
rank: the token, the step, the epoch and the world size that committed it.

A committed state pickles as a plain dict whose token is a ``str``, through
:func:`committed_token`, which this module registers with ``torch.serialization.add_safe_globals``
so that ``torch.load`` reads it with ``weights_only=True``, its default.
"""

from __future__ import annotations

import collections
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import IterableDataset

from sluice import Lease, Reader, SluiceError, _RowsSnapshot

__all__ = ["Dataset", "PendingToken", "commit", "committed_token", "to_tensors"]

_STATE_VERSION = 1

# The steps back whose states a dataset keeps for `state_dict(step)`: a loop whose loader fetches
# ahead asks for the state of the step it trained up to.
_HISTORY = 8


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
        elif pa.types.is_boolean(kind) and column.null_count == 0:
            item[name] = torch.from_numpy(column.to_numpy(zero_copy_only=False))
        else:
            item[name] = column
    return item


def committed_token(token: str) -> str:
    """What a pickled :class:`PendingToken` is loaded as: its token, a ``str``. Registered with
    ``torch.serialization.add_safe_globals`` when this module is imported."""
    if not isinstance(token, str):
        raise SluiceError(f"a data checkpoint's token is a str, not {type(token).__name__}")
    return token


torch.serialization.add_safe_globals([committed_token])


class PendingToken:
    """The token of a data checkpoint that :meth:`Dataset.state_dict` took and did not commit yet.

    It holds this rank's position at a step. :meth:`commit` sends it to the AM, which waits for every
    rank of the step (as :meth:`sluice.Reader.state_dict` does), and returns the token. Pickling it,
    as ``torch.save`` does, commits it too and stores the token alone: loaded again, it is a
    ``str``. It commits once and keeps the token; ``copy.copy`` and ``copy.deepcopy`` return it as
    it is, without committing. Commit it while the job is still in the epoch it was taken in, as
    saving it in the step it was taken does: the AM refuses a checkpoint of an epoch it has left.
    """

    __slots__ = ("step", "epoch", "rank", "world_size", "_rows", "_reader", "_token")

    def __init__(self, reader: Reader, step: int, epoch: int, rows: _RowsSnapshot) -> None:
        self.step = step
        self.epoch = epoch
        self.rank = reader.rank
        self.world_size = reader.world_size
        self._rows = rows
        self._reader = reader
        self._token: Optional[str] = None

    @property
    def positions(self) -> Dict[int, int]:
        """Per task of the epoch, the split row up to which this rank had been handed the task's rows
        at the step."""
        return self._rows.positions()

    @property
    def token(self) -> Optional[str]:
        """The token, once committed."""
        return self._token

    def commit(self) -> str:
        """Commits the position to the AM, once, and returns the checkpoint's token."""
        if self._token is None:
            self._token = self._reader._commit(self.step, self.epoch, self._rows.positions())
        return self._token

    def __reduce__(self) -> Tuple[Any, Tuple[str]]:
        return (committed_token, (self.commit(),))

    def __copy__(self) -> "PendingToken":
        return self

    def __deepcopy__(self, memo: Dict[int, Any]) -> "PendingToken":
        return self

    def __repr__(self) -> str:
        if self._token is not None:
            return f"PendingToken({self._token!r})"
        return f"PendingToken(step={self.step}, rank={self.rank}, uncommitted)"


def commit(state: Any) -> Any:
    """``state`` with every :class:`PendingToken` in it committed and replaced by its token.

    ``state`` is a state of :meth:`Dataset.state_dict`, or dicts, lists and tuples that hold one (as
    ``StatefulDataLoader.state_dict()`` does); the rest of it is returned as it is.
    """
    if isinstance(state, PendingToken):
        return state.commit()
    if isinstance(state, dict):
        return type(state)((key, commit(value)) for key, value in state.items())
    if isinstance(state, list):
        return [commit(value) for value in state]
    if type(state) is tuple:
        return tuple(commit(value) for value in state)
    return state


class Dataset(IterableDataset):
    """An ``IterableDataset`` over one rank's ring (see the module), with cheap ``state_dict()`` and
    ``load_state_dict()``.

    ``keep_batches`` is how many of the last items yielded keep their batches in the ring (see the
    module): 1 releases an item's batch when the next one is asked for, 2 suits loaders that fetch
    one item ahead. The other arguments are :class:`sluice.Reader`'s.
    """

    def __init__(self, ring: Optional[str] = None, *, keep_batches: int = 1, **reader_options: Any) -> None:
        super().__init__()
        if isinstance(keep_batches, bool) or not isinstance(keep_batches, int) or keep_batches < 1:
            raise SluiceError(f"keep_batches={keep_batches!r}: expected a whole number of items, 1 or more")
        self._ring = ring
        self._options = reader_options
        self._keep_batches = keep_batches
        self._reader: Optional[Reader] = None
        self._pending_state: Optional[Dict[str, Any]] = None
        # The batches of the last items yielded, oldest first, with their tensors over the ring.
        self._held: Deque[Tuple[Lease, List[torch.Tensor]]] = collections.deque()
        # (step, epoch, rows) after each of the last items yielded, and after an epoch's end.
        self._history: Deque[Tuple[int, int, _RowsSnapshot]] = collections.deque(maxlen=_HISTORY)

    @property
    def reader(self) -> Reader:
        """The reader, opened on first use."""
        if self._reader is None:
            self._reader = Reader(self._ring, **self._options)
            if self._pending_state is not None:
                self._reader.load_state_dict(self._pending_state)
                self._pending_state = None
        return self._reader

    @property
    def step(self) -> int:
        """The items this dataset yielded, counted from the checkpoint it was loaded from."""
        return self.reader.step

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 0:
            raise SluiceError("sluice.torch.Dataset reads its ring in the process that opened it: use DataLoader(..., num_workers=0)")
        reader = self.reader
        iter(reader)  # an epoch's iteration: the reader reads on past the end of the previous one
        while True:
            try:
                batch = self._next_batch(reader)
            except StopIteration:
                if reader._epoch_over:
                    self._history.append(self._position(reader))
                return
            lease = reader.lease()
            item = to_tensors(batch)
            self._held.append((lease, self._ring_tensors(reader, item)))
            self._history.append(self._position(reader))
            yield item

    def _next_batch(self, reader: Reader) -> pa.RecordBatch:
        self._release_held(self._keep_batches - 1, copy=False)
        batch = reader._next_batch(wait=False)
        if batch is None:
            # Nothing published: the daemon may wait for the room the kept batches hold, and the AM
            # ends an epoch only once they are consumed, so they go back before this waits.
            self._release_held(0, copy=True)
            batch = reader._next_batch(wait=True)
        return batch

    def _release_held(self, keep: int, copy: bool) -> None:
        """Releases the kept batches but the newest ``keep``; with ``copy``, their ring tensors are
        first moved in place to copies, for the loop that may still use them."""
        while len(self._held) > keep:
            lease, tensors = self._held.popleft()
            if copy:
                with torch.no_grad():
                    for tensor in tensors:
                        tensor.set_(tensor.clone())
            lease.release()

    def _ring_tensors(self, reader: Reader, item: Dict[str, Any]) -> List[torch.Tensor]:
        if self._keep_batches == 1:
            return []
        start, end = reader.data_region()
        return [value for value in item.values() if isinstance(value, torch.Tensor) and start <= value.data_ptr() < end]

    @staticmethod
    def _position(reader: Reader) -> Tuple[int, int, _RowsSnapshot]:
        return reader.step, reader._yielded_epoch, reader._yielded_rows.snapshot()

    def state_dict(self, step: Optional[int] = None) -> Dict[str, Any]:
        """The data position at ``step``, without calling the AM; its token is a :class:`PendingToken`
        that commits when the state is pickled or given to :func:`commit`.

        ``step`` defaults to :attr:`step`: every item yielded counts as consumed, an item the loader
        still holds included. An earlier step (one of the last few) names the position as it was when
        the dataset had yielded that many items: a loop whose loader fetches ahead passes the step
        it trained up to. The state holds the token, the step, the epoch and the world size.
        """
        reader = self.reader
        reader._require_am("state_dict()")
        if step is None or int(step) == reader.step:
            at_step = self._position(reader)
        else:
            step = int(step)
            found = [entry for entry in self._history if entry[0] == step]
            if not found:
                kept = f"steps {self._history[0][0]} to {self._history[-1][0]}" if self._history else "no earlier step"
                raise SluiceError(
                    f"state_dict(step={step}): the dataset is at step {reader.step} and keeps the states of {kept}; "
                    "ask for the state of a step it yielded lately"
                )
            # The last state of the step: the end of an epoch right after it belongs to it.
            at_step = found[-1]
        step, epoch, rows = at_step
        return {
            "version": _STATE_VERSION,
            "token": PendingToken(reader, step, epoch, rows),
            "step": step,
            "epoch": epoch,
            "world_size": reader.world_size,
        }

    def checkpoint(self, step: Optional[int] = None) -> Dict[str, Any]:
        """:meth:`state_dict` committed now: the state with its token, a ``str``."""
        return commit(self.state_dict(step))

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from ``state`` (see :meth:`sluice.Reader.load_state_dict`), a state of
        :meth:`state_dict` or of :meth:`sluice.Reader.state_dict`; must come before the first item is
        read. A state whose token is still pending is committed first."""
        state = commit(state)
        if self._reader is None:
            self._pending_state = state
        else:
            self._reader.load_state_dict(state)

    def close(self) -> None:
        """Releases the kept batches (their tensors may then show later rows)."""
        self._release_held(0, copy=False)
        if self._reader is not None:
            self._reader.close()
