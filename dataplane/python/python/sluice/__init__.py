"""Zero-copy Arrow record batches from Sluice's shared-memory rings, with exactly-once data checkpoints.

A trainer launched by the AM finds its ring in ``SLUICE_RING``; one launched by torchrun or srun
for a job whose AM launches nothing finds it from its ranks and ``SLUICE_AM`` (``sluice._attach``)::

    import sluice

    reader = sluice.Reader()
    for epoch in range(epochs):
        for batch in reader:          # pyarrow.RecordBatch, pointing into the ring
            train(batch)
            if step % 1000 == 0:
                save(model, reader.state_dict())

**Lifetime of a batch.** A batch's buffers point into the ring's shared memory. The batch is
released (its rows count as consumed, and the node daemon may write over its bytes) when the next
batch is asked for. To keep it longer, take a lease *before* asking for the next one::

    lease = reader.lease()            # the batch the iterator yielded last
    ...                               # read on: lease.batch stays intact
    lease.release()                   # or `with reader.lease() as lease:`, or drop it

A batch used after its release stays readable memory (the mapping outlives it) but may show the
rows of a later batch; it never crashes the process.

**Positions and checkpoints.** A rank's position in a task is the end of the last batch of the task
that it released, counted over the released prefix of the ring: a batch held by a lease holds back
the position of the batches after it too. ``state_dict()`` commits the position to the AM and returns
a dict holding the checkpoint's token. The checkpoint calls go to the AM at ``SLUICE_AM`` as JSON
over HTTP, on the port of its gRPC API, with the standard library (``sluice._am``); the native
module only reads the ring. To resume, call ``load_state_dict(state)`` on a new reader
before reading: a trainer the AM launched again after a crash does so, and the AM restarts every
trainer of the job from that checkpoint (each one then loads it again, and reads on from there).
A job started again from the token (``sluice run JOB --resume-from TOKEN``) stands at the checkpoint
already, and its trainers read on at once.

``Reader.state_dict()`` commits at once, every rank waiting for the others. ``sluice.torch.Dataset``,
whose loaders may ask for the state at every step, notes the position without calling the AM and
commits it when the state is pickled (see :mod:`sluice.torch`).
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any, Dict, Iterator, Optional

import pyarrow as pa

from sluice._am import commit_data_checkpoint, restore_data_checkpoint
from sluice._attach import attach, ranks_from_env
from sluice._native import Reader as _RingReader
from sluice._native import SluiceError

__all__ = ["Lease", "Reader", "SluiceError"]

_STATE_VERSION = 1

# How often a reader looks again for a ring file being replaced, or whether it was stopped.
_POLL_S = 0.02


def _env_int(name: str, explicit: Optional[int]) -> int:
    if explicit is not None:
        return explicit
    value = os.environ.get(name)
    if value is None:
        return {"SLUICE_RANK": 0, "SLUICE_WORLD_SIZE": 1}[name]
    try:
        return int(value)
    except ValueError:
        raise SluiceError(f"{name}={value!r}: expected an integer; the AM sets it for the trainers it launches") from None


class _TaskRows:
    """Per task of an epoch, the split row up to which its batches were handed out.

    A task's rows come in order on one ring, so the row only grows. The tasks changed lately sit in a
    small dict beside the others, which are folded into a dict never changed once made: a snapshot
    shares that one and copies the few recent ones, so taking it costs the same however many tasks
    the epoch has.
    """

    __slots__ = ("_folded", "_recent")

    # Recent tasks folded at once: a fold copies every task of the epoch, once per this many.
    _FOLD_AT = 64

    def __init__(self) -> None:
        self._folded: Dict[int, int] = {}
        self._recent: Dict[int, int] = {}

    def advance(self, task_id: int, end_row: int) -> None:
        known = self._recent.get(task_id, self._folded.get(task_id, 0))
        if end_row <= known:
            return
        self._recent[task_id] = end_row
        if len(self._recent) >= self._FOLD_AT:
            self._folded = {**self._folded, **self._recent}
            self._recent = {}

    def snapshot(self) -> "_RowsSnapshot":
        return _RowsSnapshot(self._folded, dict(self._recent))


class _RowsSnapshot:
    """What a :class:`_TaskRows` held when it was taken: the folded dict, shared, and a copy of the
    recent one."""

    __slots__ = ("_folded", "_recent")

    def __init__(self, folded: Dict[int, int], recent: Dict[int, int]) -> None:
        self._folded = folded
        self._recent = recent

    def positions(self) -> Dict[int, int]:
        return {**self._folded, **self._recent}


class Lease:
    """A batch kept past the next read, with its row range; released by :meth:`release`, by leaving a
    ``with`` block, or when the lease is garbage collected."""

    __slots__ = ("batch", "task_id", "first_row", "row_count", "_record")

    def __init__(self, batch: pa.RecordBatch, record: Any) -> None:
        self.batch = batch
        self.task_id: int = record.task_id
        self.first_row: int = record.first_row
        self.row_count: int = record.row_count
        self._record = record

    @property
    def released(self) -> bool:
        return self._record.released

    def release(self) -> None:
        """Gives the batch back to the daemon; its buffers may then show later rows."""
        self._record.release()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __del__(self) -> None:
        record = getattr(self, "_record", None)
        if record is not None:
            record.release()


class Reader:
    """Reads the batches of one trainer rank's ring in place.

    ``ring`` defaults to ``SLUICE_RING``; without either, the trainer was launched by someone else
    (torchrun, srun) and finds its ring from its ranks, as :mod:`sluice._attach` describes. The reader waits up to ``wait_s`` for the node daemon to
    create the ring, and raises :class:`SluiceError` when the ring stays empty with no live daemon for
    ``peer_timeout_s``, or when the daemon reports an error. Iterating yields the batches of one epoch
    and stops at its end (iterate again for the next epoch) or at the end of the data.

    The AM's address, the rank and the world size default to ``SLUICE_AM``, ``SLUICE_RANK`` and
    ``SLUICE_WORLD_SIZE``, and the AM's shared token to ``SLUICE_TOKEN``, as the AM sets them for the
    trainers it launches. ``SLUICE_AM`` is the address of the AM's API (``host:port``): the reader
    calls the JSON form of its checkpoint calls there, over HTTP, each within
    ``checkpoint_timeout_s``.
    """

    def __init__(
        self,
        ring: Optional[str] = None,
        *,
        wait_s: float = 60.0,
        peer_timeout_s: float = 60.0,
        am: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        checkpoint_timeout_s: float = 300.0,
    ) -> None:
        self._am = am if am is not None else os.environ.get("SLUICE_AM")
        self._auth_token = os.environ.get("SLUICE_TOKEN")
        path = ring if ring is not None else os.environ.get("SLUICE_RING")
        if path:
            self.rank = _env_int("SLUICE_RANK", rank)
            self.world_size = _env_int("SLUICE_WORLD_SIZE", world_size)
        else:
            ranks = ranks_from_env(rank, world_size)
            if ranks is None:
                raise SluiceError(
                    "no ring to read: pass Reader(ring=PATH), set SLUICE_RING (the AM sets it for its trainers), or launch the "
                    "trainer with torchrun or srun (RANK or SLURM_PROCID) or SLUICE_RANK, and SLUICE_AM"
                )
            path = attach(ranks, self._am, self._auth_token, checkpoint_timeout_s)
            self.rank = ranks.rank
            self.world_size = ranks.world_size
        self._wait_s = wait_s
        self._peer_timeout_s = peer_timeout_s
        self._native = _RingReader(str(path), wait_s, peer_timeout_s)
        # The inode of the file opened, not of the path's file now: a daemon giving its rings back may
        # have unlinked it since.
        self._ring_inode = self._native.inode
        self._checkpoint_timeout_s = checkpoint_timeout_s
        self._schema: Optional[pa.Schema] = None
        # The record of the batch yielded last, released when the next one is asked for.
        self._current: Any = None
        self._current_batch: Optional[pa.RecordBatch] = None
        # Records handed out and not yet known to be released, in ring order:
        # (position, task_id or None for an epoch's end, end_row).
        self._unreleased: collections.deque = collections.deque()
        # The epoch and per-task positions of the released prefix.
        self._epoch = 0
        self._positions: Dict[int, int] = {}
        self._batches = 0
        self._step_offset = 0
        self._finished = False
        self._epoch_over = False
        self._token: Optional[str] = None
        # The epoch and per-task rows of every batch handed out, released or not.
        self._yielded_epoch = 0
        self._yielded_rows = _TaskRows()

    # -- reading ---------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return str(self._native.path)

    def data_region(self) -> tuple:
        """The address range ``(start, end)`` of the ring's data in this process."""
        return self._native.data_region()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        self._epoch_over = False
        return self

    def __next__(self) -> pa.RecordBatch:
        self._release_current()
        batch = self._next_batch(wait=True)
        assert batch is not None, "a read that waits returns a batch or stops"
        return batch

    def _next_batch(self, wait: bool) -> Optional[pa.RecordBatch]:
        """The next batch, held as the current one; raises StopIteration at the end of the epoch or of
        the data. Without ``wait``, returns None instead of waiting when the daemon has published
        no record, and never learns then that the daemon closed the ring."""
        if self._finished or self._epoch_over:
            raise StopIteration
        while True:
            item = self._native.next() if wait else self._native.try_next()
            if item is None:
                if not wait:
                    return None
                self._finished = True
                raise StopIteration
            record, kind, position, task_id, end_row, address, size = item
            if kind == "batch":
                if self._schema is None:
                    sequence = record.sequence
                    record.release()
                    raise SluiceError(f"ring {self.path}: record {sequence} is a batch before any schema; the node daemon must write the schema first")
                buffer = pa.foreign_buffer(address, size, base=record)
                batch = pa.ipc.read_record_batch(pa.ipc.read_message(buffer), self._schema)
                self._unreleased.append((position, task_id, end_row))
                self._yielded_rows.advance(task_id, end_row)
                self._current = record
                self._current_batch = batch
                self._batches += 1
                return batch
            if kind == "schema":
                self._schema = pa.ipc.read_schema(pa.py_buffer(record.to_bytes()))
                record.release()
            elif kind == "dropped":
                # Rows the epoch leaves out (data.even_batches: drop): read, but not handed out.
                self._unreleased.append((position, task_id, end_row))
                self._yielded_rows.advance(task_id, end_row)
                record.release()
            elif kind == "end_of_epoch":
                self._unreleased.append((position, None, 0))
                record.release()
                self._yielded_epoch += 1
                self._yielded_rows = _TaskRows()
                self._epoch_over = True
                raise StopIteration
            else:
                message = record.to_bytes().decode("utf-8", "replace")
                record.release()
                raise SluiceError(f"ring {self.path}: the node daemon reports: {message}")

    def _release_current(self) -> None:
        if self._current is not None:
            self._current.release()
            self._current = None
            self._current_batch = None

    def lease(self) -> Lease:
        """Keeps the batch the iterator yielded last past the next read; see :class:`Lease`."""
        if self._current is None:
            raise SluiceError("no batch to lease: call lease() after the iterator yielded a batch and before asking for the next one")
        lease = Lease(self._current_batch, self._current)
        self._current = None
        self._current_batch = None
        return lease

    def close(self) -> None:
        """Releases the current batch; leases stay valid until released."""
        self._release_current()

    def _wait_to_be_stopped(self, token: str) -> None:
        """Waits for the AM, which restarts every trainer from checkpoint ``token``, to stop this one."""
        started = time.monotonic()
        while time.monotonic() - started < self._checkpoint_timeout_s:
            time.sleep(_POLL_S)
        raise SluiceError(
            f"load_state_dict: the AM restarts every trainer from checkpoint {token}, but did not stop this one within "
            f"{self._checkpoint_timeout_s:.1f} s; check that the AM that launched this trainer runs (SLUICE_AM={self._am})"
        )

    def _ring_replaced(self) -> bool:
        """Whether the file at this reader's path is no longer the ring it opened."""
        try:
            return os.stat(self.path).st_ino != self._ring_inode
        except FileNotFoundError:
            return True

    def _reopen_replaced_ring(self, token: str) -> None:
        """Opens the ring the daemon creates anew after giving the old one back to the AM.

        The old ring stays mapped until then: its inode, unlinked but mapped, cannot be reused by the
        new file, so a new inode number at the path is the new ring."""
        path = self.path
        started = time.monotonic()
        while True:
            try:
                if os.stat(path).st_ino != self._ring_inode:
                    break
            except FileNotFoundError:
                pass
            if time.monotonic() - started >= self._wait_s:
                raise SluiceError(
                    f"load_state_dict: the AM took the rings back to restore checkpoint {token}, but no new ring replaced "
                    f"{path} within {self._wait_s:.1f} s; check that the node daemon runs"
                )
            time.sleep(_POLL_S)
        self._native = _RingReader(path, self._wait_s, self._peer_timeout_s)
        self._ring_inode = self._native.inode

    # -- positions and checkpoints ---------------------------------------------------------------

    def _advance_positions(self) -> None:
        released = self._native.position()
        while self._unreleased and self._unreleased[0][0] < released:
            _, task_id, end_row = self._unreleased.popleft()
            if task_id is None:
                self._epoch += 1
                self._positions = {}
            elif end_row > 0:
                # A pad batch (data.even_batches: pad) covers no row of any task: it ends at row 0.
                self._positions[task_id] = max(self._positions.get(task_id, 0), end_row)

    @property
    def epoch(self) -> int:
        """The epoch of the released prefix."""
        self._advance_positions()
        return self._epoch

    @property
    def positions(self) -> Dict[int, int]:
        """Per task of the current epoch, the split row up to which this rank consumed it."""
        self._advance_positions()
        return dict(self._positions)

    @property
    def step(self) -> int:
        """The batches this reader yielded, counted from the checkpoint it was loaded from."""
        return self._step_offset + self._batches

    def state_dict(self, step: Optional[int] = None) -> Dict[str, Any]:
        """Commits this rank's data position to the AM and returns the checkpoint.

        Every batch yielded so far counts as consumed: the current batch is released (batches held
        by leases are not, and come again after a resume). ``step`` defaults to :attr:`step`; every
        rank must commit the same step, and the call waits up to ``checkpoint_timeout_s`` for the
        others. The returned dict holds the token, the step, the epoch and this rank's positions.
        """
        self._require_am("state_dict()")
        self._release_current()
        self._advance_positions()
        step = self.step if step is None else int(step)
        positions = dict(self._positions)
        token = self._commit(step, self._epoch, positions)
        return {
            "version": _STATE_VERSION,
            "token": token,
            "step": step,
            "epoch": self._epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "positions": {int(task): int(end) for task, end in sorted(positions.items())},
        }

    def _require_am(self, what: str) -> None:
        if not self._am:
            raise SluiceError(f"{what} needs the AM's address: set SLUICE_AM (the AM sets it for its trainers) or pass Reader(am=ADDRESS)")

    def _commit(self, step: int, epoch: int, positions: Dict[int, int]) -> str:
        """Commits this rank's ``positions`` of ``epoch`` at ``step`` to the AM, waiting for the other
        ranks of the step; returns the checkpoint's token."""
        self._require_am("a data checkpoint")
        token = commit_data_checkpoint(
            self._am,
            self._auth_token,
            step,
            self.rank,
            self.world_size,
            epoch,
            sorted(positions.items()),
            self._checkpoint_timeout_s,
        )
        self._token = token
        return token

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from a checkpoint that ``state_dict()`` returned; must come before the first
        batch is read.

        With the AM's address, the data of the checkpoint comes from the AM, which restores the
        checkpoint on the live job: it stops every trainer it launched, this one included, takes
        every ring back and launches the trainers again. This call then waits to be stopped. Each
        relaunched trainer loads the same checkpoint, which the AM then already stands at: the call
        returns at once and the ring holds exactly the rows after the checkpoint. Ranks that load
        different checkpoints are refused. Without the AM's address, the job must have been started
        from the checkpoint's token (``sluice run JOB --resume-from TOKEN``).

        The token names the job's data position, whatever the number of ranks: any rank's state of
        a checkpoint restores the job, and a job resumed with another number of trainers (another
        ``roles[].num`` or node count) loads it in every rank, a new rank included (for example the
        state of rank ``rank % saved_world_size``). The rows not consumed at the checkpoint then
        reach the new ranks exactly once. The AM counts what the checkpoint had consumed in every
        later checkpoint of its epoch, so a rank reports only what it reads after loading.

        The reader's step and epoch become the checkpoint's. A reader that has read already
        refuses: load the state in a new reader (a relaunched trainer), or restart the job from the
        token.
        """
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION or "token" not in state:
            raise SluiceError(f"load_state_dict: not a sluice reader state (expected a dict of version {_STATE_VERSION} with a token, as state_dict() returns)")
        if self._batches or self._unreleased or self._finished:
            raise SluiceError(
                f"load_state_dict: this reader has read batches already; to go back to checkpoint {state['token']}, "
                "call load_state_dict() on a new reader before reading (as a relaunched trainer does), or restart the job "
                f"with `sluice run JOB --resume-from {state['token']}`"
            )
        if self._am and os.environ.get("SLUICE_RESTORED_TO") == state["token"]:
            # Launched by the AM's restore to this very checkpoint: the job stands there, whatever
            # the ranks launched with this one read meanwhile.
            if self._ring_replaced():
                self._reopen_replaced_ring(state["token"])
        elif self._am:
            effect = restore_data_checkpoint(self._am, self._auth_token, state["token"], self.rank, self._checkpoint_timeout_s)
            if effect == "trainers_restart":
                self._wait_to_be_stopped(state["token"])
            elif effect == "rings_replaced" or self._ring_replaced():
                # Already there, but the ring this reader opened may have been replaced by the
                # restore another rank asked for first (trainers that no AM launched, which live on
                # through it): read the new one.
                self._reopen_replaced_ring(state["token"])
        self._token = state["token"]
        self._step_offset = int(state["step"])
        self._epoch = int(state["epoch"])
        self._positions = {}
        self._yielded_epoch = self._epoch
        self._yielded_rows = _TaskRows()
