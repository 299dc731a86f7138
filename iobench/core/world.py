"""Who am I among the ranks: rank, world size, node, with collectives.

Works the same with one plain process, under `mpiexec`/`srun` (mpi4py), and
under `torchrun` (environment variables; collectives through
torch.distributed once the training loop has initialised it). MPI is only
imported when a launcher says it started us, so plain runs never pay for it.

A node is what the scheduler calls one (`node_name`: Slurm's SLURMD_NODENAME,
else the host name): ranks are grouped into nodes, and local ranks numbered,
by that name, so two virtual Slurm nodes on one host are two nodes, each
evicting and measuring for itself.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from iobench.core.interrupts import pending, settle

_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS",
            "HYDRA_CONTROL_FD", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


@dataclass
class World:
    """This process's place in the job; `launcher` is "single", "mpi" or "torchrun"."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: int = 0  # index of this host among the job's hosts
    num_nodes: int = 1
    launcher: str = "single"
    hostname: str = field(default_factory=socket.gethostname)
    node_name: str = ""  # the scheduler's name for this node; "" means the host name
    num_hosts: int = 1  # distinct host names among the job's ranks
    node_names: tuple[str, ...] = ()  # every node's name, by node index (empty: not known)
    _comm: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.node_name:
            self.node_name = self.hostname
        if not self.node_names and self.num_nodes == 1:
            self.node_names = (self.node_name,)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def comm(self) -> Any:
        """The mpi4py communicator, or None when not launched under MPI."""
        return self._comm

    def barrier(self) -> None:
        if self.size == 1:
            return
        self.allgather(None)  # no rank returns before every rank came: a barrier

    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (picklable objects).

        Each rank's recorded interrupt travels with it, so after the same collective
        every rank raises `Interrupted` or none does (`iobench.core.interrupts.settle`).
        """
        if self.size == 1:
            return [obj]
        mine = (pending(), obj)
        if self._comm is not None:
            wait_politely(self._comm)
            everyone = self._comm.allgather(mine)
        else:
            import torch.distributed as dist

            everyone = [None] * self.size
            dist.all_gather_object(everyone, mine)
        settle(s for s, _ in everyone)
        return [o for _, o in everyone]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """`obj` from rank `root` on every rank (small objects: an allgather, which carries
        the ranks' interrupts as every collective here does)."""
        if self.size == 1:
            return obj
        return self.allgather(obj if self.rank == root else None)[root]

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (a failed rank must not leave others hanging)."""
        if self._comm is not None and self.size > 1:
            self._comm.Abort(code)

    def end_job(self, message: str) -> NoReturn:
        """One rank failed alone: say which and why, and end every rank (exit status 3)."""
        print(f"iobench: error: {message}; ending all {self.size} ranks", file=sys.stderr,
              flush=True)
        if self._comm is not None and self.size > 1:
            # the launcher forwards our stderr from a pipe; MPI_Abort kills its proxies, which
            # can drop a line not yet read (the job then ends without saying why)
            time.sleep(END_JOB_FORWARD_S)
        self.abort(3)  # MPI: ends every rank; torchrun: the agent ends the others on our exit
        sys.exit(3)


END_JOB_FORWARD_S = 0.5  # a failed rank's pause between its error line and MPI_Abort
LEAVE_GRACE_S = 10.0  # an interrupted rank waits this long for its peers to stop as well
_leaving: Any = None  # a copy of MPI's world communicator, used only to leave together
POLL_FIRST_S, POLL_MAX_S = 50e-6, 2e-3  # a waiting rank's sleeps between its looks


def wait_politely(comm: Any) -> None:
    """Return once every rank has come here, sleeping while it waits: MPICH's blocking
    collectives poll at 100 % of a core (measured: a rank waiting 2 s in allgather used
    2.0 CPU-s), which on a host whose cores the other ranks' copy threads, loader workers or
    the tier's daemons need steals them from the work being measured. A nonblocking barrier,
    tested every 50 us doubling to 2 ms, costs at most that after the last rank arrives."""
    sleep_until(comm.Ibarrier().Test)


def sleep_until(ready: Callable[[], bool]) -> None:
    """Return once `ready()` is true, asking every 50 us doubling to 2 ms and sleeping in
    between (MPI's own blocking waits poll at a full core: `wait_politely`)."""
    delay = POLL_FIRST_S
    while not ready():
        time.sleep(delay)
        delay = min(delay * 2, POLL_MAX_S)


def leave_after_interrupt(code: int, grace_s: float = LEAVE_GRACE_S) -> None:
    """An interrupted command that has no collective to carry its interrupt to its peers
    (generate, stage, bench-read, ...): wait up to `grace_s` for every rank to be leaving
    too (a barrier of its own, so it meets no other collective). When the signal reached
    this rank alone, its peers work on and would never finalise MPI, and this rank's
    finalising would wait for them for ever: then every rank is ended with `code`
    (MPI_Abort), so the job stops instead of hanging. A rank interrupted before it joined
    the job (its peers wait for it in `get_world`) joins it first. Nothing to do outside an
    MPI job of several ranks."""
    if not launched_by_mpi():
        return
    import signal

    for s in (signal.SIGINT, signal.SIGTERM):  # one interrupt is enough (mpiexec forwards
        signal.signal(s, signal.SIG_IGN)       # the one the ranks may have had already)
    mpi = sys.modules.get("mpi4py.MPI")
    if _leaving is None:
        if mpi is not None and mpi.Is_initialized():  # interrupted while joining: no way
            if mpi.COMM_WORLD.Get_size() > 1:           # to tell where the peers are
                mpi.COMM_WORLD.Abort(code)
            return
        get_world()  # the peers wait for this rank there
        if _leaving is None:
            return  # a job of one rank
    import time

    done = _leaving.Ibarrier()
    deadline = time.monotonic() + grace_s
    while not done.Test():
        if time.monotonic() > deadline:
            print(f"iobench: rank {_leaving.Get_rank()} was interrupted alone; ending all "
                  f"{_leaving.Get_size()} ranks", file=sys.stderr, flush=True)
            _leaving.Abort(code)
        time.sleep(0.02)


def launched_by_mpi(env: Mapping[str, str] | None = None) -> bool:
    """Whether an MPI launcher (mpiexec, srun with PMI) started this process."""
    env = os.environ if env is None else env
    return any(k in env for k in _MPI_ENV)


# Per-task variables that name the node a task runs on, by scheduler. PBS and Flux start
# tasks through an MPI launcher (PALS, flux-run) and set none: the host name is the node.
NODE_NAME_ENV = ("SLURMD_NODENAME",)


def node_name(env: Mapping[str, str] | None = None, host: str | None = None) -> str:
    """This process's node as its scheduler names it (SLURMD_NODENAME), else the host name."""
    env = os.environ if env is None else env
    for k in NODE_NAME_ENV:
        if env.get(k):
            return env[k]
    return host or socket.gethostname()


def get_world() -> World:
    """Detect the launcher and return this process's World."""
    env = os.environ
    host = socket.gethostname()
    name = node_name(env, host)
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env
                                         and "LOCAL_RANK" in env and not launched_by_mpi()):
        size = int(env["WORLD_SIZE"])
        local_size = int(env.get("LOCAL_WORLD_SIZE", size))
        rank = int(env["RANK"])
        node = int(env.get("GROUP_RANK", rank // max(local_size, 1)))
        return World(rank=rank, size=size, local_rank=int(env["LOCAL_RANK"]),
                     local_size=local_size, node=node,
                     num_nodes=max(1, size // max(local_size, 1)), launcher="torchrun",
                     hostname=host, node_name=name, num_hosts=max(1, size // max(local_size, 1)))
    if launched_by_mpi():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if comm.Get_size() > 1:
            # nodes by the scheduler's name, not by shared memory: two virtual nodes on one
            # host (a test cluster) must each be a node
            pairs = comm.allgather((name, host))
            names = [p[0] for p in pairs]
            unique = sorted(set(names), key=names.index)
            node = unique.index(name)
            local = comm.Split(color=node, key=comm.Get_rank())
            world = World(rank=comm.Get_rank(), size=comm.Get_size(),
                          local_rank=local.Get_rank(), local_size=local.Get_size(),
                          node=node, num_nodes=len(unique), launcher="mpi",
                          hostname=host, node_name=name,
                          num_hosts=len({p[1] for p in pairs}), node_names=tuple(unique),
                          _comm=comm)
            local.Free()
            global _leaving
            if _leaving is None:  # every rank gets its world the same times: collective
                _leaving = comm.Dup()
            return world
    return World(hostname=host, node_name=name)


def agree(world: World, error: BaseException | None, what: str = "") -> None:
    """A collective: return when no rank failed, else raise on every rank (so none is left
    waiting at the next collective), the raised `IobenchError` marked `agreed`.

    A rank that failed raises its own error (a bare `OSError` as a `StorageError` naming
    the file), renamed `rank R: message` after the first failing rank when the ranks did
    not all fail alike. A rank that did not fail raises a `DistributedError`: `rank R:
    message`, or `<what> failed on rank R: message` when `what` is given.
    """
    from iobench.core.errors import DistributedError, IobenchError, StorageError

    msgs = world.allgather(None if error is None else str(error))
    bad = [(r, m) for r, m in enumerate(msgs) if m is not None]
    if not bad:
        return
    r, m = bad[0]
    cause = None
    if error is None:
        error = DistributedError(f"{what} failed on rank {r}: {m}" if what else f"rank {r}: {m}")
    elif isinstance(error, IobenchError) and (len({m for _, m in bad}) > 1
                                              or len(bad) < world.size):
        error = type(error)(f"rank {r}: {m}")
    elif isinstance(error, OSError) and not isinstance(error, IobenchError):
        cause = error
        error = StorageError(f"{error.filename or what or 'a rank'}: {error.strerror or error}")
    if isinstance(error, IobenchError):
        error.agreed = True
    if cause is not None:
        raise error from cause
    raise error
