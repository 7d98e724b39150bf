"""Several processes training one model: the few DistributedDataParallel helpers gptlib needs.

``torchrun --nproc_per_node=N -m gptlib.train ...`` starts N copies of the training script and
tells each one who it is through environment variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). Each process joins a process group (``gloo`` on
CPU, ``nccl`` on CUDA), draws its own batches, and DistributedDataParallel averages the gradients
so that every process applies the same update: the ranks stay identical. Only rank 0 writes files
and prints. The same code runs unchanged in a single process, where none of this is active; for
several machines, use torchrun's multi-node flags (``--nnodes``, ``--node_rank``,
``--rdzv_endpoint``). To resume on several machines, the checkpoint must be at the same path on
each of them (a shared file system, or a copy), since every rank reads it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    """Who this process is. A single process is rank 0 of a world of size 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # index among the processes of this machine (picks the GPU)

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes checkpoints and logs."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """True when more than one process trains together."""
        return self.world_size > 1


def env_info() -> DistInfo | None:
    """The rank information torchrun put in the environment, or None outside torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError as err:
        raise RuntimeError(f"malformed torchrun environment variables ({err})") from None
    return DistInfo(rank, world, local)


def current() -> DistInfo:
    """This process's rank information from an initialised process group (else rank 0 of 1)."""
    if dist.is_available() and dist.is_initialized():
        env = env_info()
        local = env.local_rank if env is not None else dist.get_rank()
        return DistInfo(dist.get_rank(), dist.get_world_size(), local)
    return DistInfo()


def is_main_process() -> bool:
    """True unless this is a non-zero rank (also before any process group exists)."""
    info = current() if dist.is_available() and dist.is_initialized() else env_info()
    return info is None or info.is_main


def init_from_env(device_type: str = "cpu", timeout_s: float = 600.0) -> DistInfo:
    """Join the process group torchrun prepared; a no-op (rank 0 of 1) outside torchrun.

    The backend is ``nccl`` for CUDA and ``gloo`` otherwise. On CUDA each process uses the GPU
    ``LOCAL_RANK``.
    """
    info = env_info()
    if info is None or info.world_size == 1:
        return DistInfo()
    if not dist.is_available():
        raise RuntimeError("this PyTorch build has no torch.distributed; run a single process")
    if dist.is_initialized():
        return current()
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return current()


def shutdown() -> None:
    """Leave the process group if one is active."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel (or similar ``.module``) wrapper."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel around ``model`` when several processes train, else ``model``.

    DDP broadcasts rank 0's parameters and buffers when it is built, so all ranks start equal.
    """
    if not current().enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index if device.index is not None else 0] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """The mean of ``t`` over all ranks (a copy; ``t`` itself is unchanged)."""
    info = current()
    if not info.enabled:
        return t
    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / info.world_size


def all_gather_objects(obj: object) -> list:
    """Every rank's ``obj`` (a list indexed by rank); ``[obj]`` in a single process."""
    info = current()
    if not info.enabled:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait until every rank gets here (no-op in a single process)."""
    if current().enabled:
        dist.barrier()


def parameter_digest(model: nn.Module) -> str:
    """sha256 over every parameter's name, shape and bytes: equal digests, equal models."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()
