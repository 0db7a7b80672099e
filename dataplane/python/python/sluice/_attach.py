"""Trainers that someone else launched (torchrun, srun, a Kubernetes Job) find their ring.

Under a job spec with ``launcher: { kind: external }`` the AM launches nothing, so no ``SLUICE_RING``
is set. The trainer takes its ranks from its launcher's environment, in this order:

- rank: ``SLUICE_RANK``, ``RANK`` (torchrun), ``SLURM_PROCID`` (srun);
- world size: ``SLUICE_WORLD_SIZE``, ``WORLD_SIZE``, ``SLURM_NTASKS``;
- local rank: ``SLUICE_LOCAL_RANK``, ``LOCAL_RANK``, ``SLURM_LOCALID``, else the rank (one node);
- local world size: ``SLUICE_LOCAL_WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``SLURM_NTASKS_PER_NODE``,
  the first count of ``SLURM_TASKS_PER_NODE``, else the world size.

Its ring is ``<ring dir>/<job>/<local rank>.ring``, the ring directory being ``SLUICE_RING_DIR``
(the daemon's ``--ring-dir``, ``/dev/shm/sluice-<uid>`` by default) and the job ``SLUICE_JOB``, or the
job the AM at ``SLUICE_AM`` runs. The trainer announces itself beside it, in
``<local rank>.trainer`` (``rank=.. local_rank=.. world_size=.. local_world_size=.. pid=..``, the
format of the ring crate's ``announce`` module), and the node's daemon opens the ring once every
local rank of the node has announced itself.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from sluice._am import job_of
from sluice._native import SluiceError

# The daemon's default --ring-dir: a directory of the user's own. A trainer running as another user
# than the daemon (its --shared-group) is given SLUICE_RING or SLUICE_RING_DIR.
DEFAULT_RING_DIR = f"/dev/shm/sluice-{os.geteuid()}"


def _first_int(names: Sequence[str]) -> Optional[int]:
    for name in names:
        value = os.environ.get(name)
        if value is None or value == "":
            continue
        try:
            return int(value)
        except ValueError:
            raise SluiceError(f"{name}={value!r}: expected an integer; check how the trainer was launched") from None
    return None


def _slurm_tasks_per_node() -> Optional[int]:
    # "2(x3),1": this node's count is not named; the first is right when every node runs as many.
    value = os.environ.get("SLURM_TASKS_PER_NODE")
    if not value:
        return None
    match = re.match(r"(\d+)", value)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Ranks:
    """Where a trainer stands in the job, as its launcher numbered it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    def line(self) -> str:
        return (
            f"rank={self.rank} local_rank={self.local_rank} world_size={self.world_size} "
            f"local_world_size={self.local_world_size} pid={os.getpid()}\n"
        )


def ranks_from_env(rank: Optional[int] = None, world_size: Optional[int] = None) -> Optional[Ranks]:
    """The trainer's ranks from its launcher's environment; ``None`` when no launcher set any."""
    rank = rank if rank is not None else _first_int(("SLUICE_RANK", "RANK", "SLURM_PROCID"))
    if rank is None:
        return None
    world_size = world_size if world_size is not None else _first_int(("SLUICE_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS"))
    if world_size is None:
        world_size = 1
    local_rank = _first_int(("SLUICE_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"))
    local_world_size = _first_int(("SLUICE_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"))
    if local_world_size is None:
        local_world_size = _slurm_tasks_per_node()
    if local_rank is None:
        local_rank = rank
    if local_world_size is None:
        local_world_size = world_size
    ranks = Ranks(rank, world_size, local_rank, local_world_size)
    if not (0 <= rank < world_size and 0 <= local_rank < local_world_size <= world_size):
        raise SluiceError(
            f"trainer ranks out of range: rank {rank} of {world_size}, local rank {local_rank} of {local_world_size}; "
            "check RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (or SLUICE_RANK and SLUICE_WORLD_SIZE)"
        )
    return ranks


def attach(ranks: Ranks, am: Optional[str], token: Optional[str], timeout_s: float) -> str:
    """Announces the trainer to its node's daemon; returns the path of the ring to read."""
    job = os.environ.get("SLUICE_JOB")
    if not job:
        if not am:
            raise SluiceError(
                "no ring to read: set SLUICE_AM to the AM's address (the trainer asks it for the job), or SLUICE_RING, "
                "or SLUICE_JOB and SLUICE_RING_DIR"
            )
        job, expected = job_of(am, token, timeout_s)
        if expected != ranks.world_size:
            raise SluiceError(
                f"job {job} expects {expected} trainers in all (its roles' `num`), but this trainer's launcher says "
                f"world size {ranks.world_size}; launch as many trainers as the job spec's roles name"
            )
    # A job spec's name: lowercase letters, digits, `-`, `_` and `.`, starting with a letter or digit.
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,62}", job):
        raise SluiceError(f"job name {job!r} is not a job's name (a lowercase slug); check SLUICE_JOB")
    job_dir = os.path.join(os.environ.get("SLUICE_RING_DIR") or DEFAULT_RING_DIR, job)
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    path = os.path.join(job_dir, f"{ranks.local_rank}.trainer")
    temporary = os.path.join(job_dir, f".{ranks.local_rank}.{os.getpid()}.tmp")
    # A name planted in advance is removed, never followed; the directory's mode keeps others out.
    try:
        os.unlink(temporary)
    except FileNotFoundError:
        pass
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o660)
    with os.fdopen(descriptor, "w") as file:
        file.write(ranks.line())
    os.replace(temporary, path)
    return os.path.join(job_dir, f"{ranks.local_rank}.ring")
