"""Several processes, the way torchrun launches them: the process group, sums and gathers, the run's lock.

One process needs none of this: every helper here is a no-op when WORLD_SIZE is 1 or unset, so
the single-process path stays plain. The backend follows the device: NCCL on CUDA, gloo otherwise.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def ranks() -> Ranks:
    """This process's place, from the initialised process group or torchrun's environment."""
    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    return Ranks(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                 int(os.environ.get("LOCAL_RANK", "0")))


def setup(device: torch.device) -> Ranks:
    """Join torchrun's process group (once) when launched with WORLD_SIZE > 1; returns this process's ranks."""
    r = ranks()
    if r.enabled and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
        r = ranks()
    return r


def sum_across(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum of `values` over every process (the values themselves in one process)."""
    if not ranks().enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def gather_objects(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every process ([obj] in one process)."""
    r = ranks()
    if not r.enabled:
        return [obj]
    out = [None] * r.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if ranks().enabled:
        dist.barrier()


@contextlib.contextmanager
def owned(out, command: str, device: torch.device):
    """Rank 0 holds the run directory's lock (files.RunLock) for the whole run; every process learns
    whether it got it, so all of them stop when another run owns the directory."""
    from .files import RunInUse, RunLock

    r, lock, refused = ranks(), RunLock(out, command), None
    if r.is_main:
        try:
            lock.__enter__()
        except RunInUse as e:
            refused = e
    (failed,) = sum_across([float(refused is not None)], device)
    if refused is not None:
        raise refused
    if failed:
        raise RunInUse(f"{out} is in use by another run; wait for it to finish or choose another --out.")
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def main_prints(r: Ranks) -> None:
    """Silence stdout on every process but rank 0, so a command prints its report once."""
    if not r.is_main:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)
