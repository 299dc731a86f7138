"""torch.distributed for the training loop, initialised from an `iobench.core.world.World`.

Backend `gloo` on CPU, `nccl` when CUDA is used. Under MPI (mpiexec, srun)
rank 0 chooses the rendezvous address and a free port and broadcasts them
through mpi4py, so no launcher variables are needed; under torchrun the
launcher's `MASTER_ADDR`/`MASTER_PORT` are used. The process group gets a
finite timeout so a rank that vanished makes the others fail instead of hang.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from iobench.core.errors import DistributedError
from iobench.core.world import World


def backend_for(use_cuda: bool) -> str:
    """`nccl` for CUDA tensors, `gloo` otherwise."""
    return "nccl" if use_cuda else "gloo"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _rendezvous_address(world: World) -> str:
    """An address the other ranks can reach rank 0 at."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    if world.num_hosts == 1:  # every rank on this host (virtual nodes included)
        return "127.0.0.1"
    try:
        addrs = {str(ai[4][0])
                 for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        addrs = set()
    routable = sorted(a for a in addrs if not a.startswith("127."))
    if not routable:
        raise DistributedError(f"host {socket.gethostname()!r} resolves only to loopback "
                               f"({sorted(addrs)}); set MASTER_ADDR to rank 0's address")
    return routable[0]


def init_process_group(world: World, use_cuda: bool, timeout_s: float = 300.0) -> str | None:
    """Initialise torch.distributed for `world`; return the backend (None for one rank).

    `timeout_s` bounds every collective: a rank that died makes the others
    raise after at most that long (MPI launchers usually end them sooner).
    """
    if world.size == 1:
        return None
    import torch
    import torch.distributed as dist

    backend = backend_for(use_cuda)
    if dist.is_initialized():
        return dist.get_backend()
    if use_cuda:
        torch.cuda.set_device(world.local_rank)
    timeout = timedelta(seconds=timeout_s)
    try:
        if world.launcher == "mpi":
            addr_port = None
            if world.rank == 0:
                port = int(os.environ.get("MASTER_PORT") or _free_port())
                addr_port = (_rendezvous_address(world), port)
            addr, port = world.bcast(addr_port)
            dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}",
                                    rank=world.rank, world_size=world.size, timeout=timeout)
        else:
            dist.init_process_group(backend, init_method="env://", rank=world.rank,
                                    world_size=world.size, timeout=timeout)
    except (RuntimeError, ValueError) as e:
        raise DistributedError(f"rank {world.rank}: cannot initialise torch.distributed "
                               f"({backend}): {e}") from e
    return backend


def destroy_process_group() -> None:
    """Tear down torch.distributed if it was initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
