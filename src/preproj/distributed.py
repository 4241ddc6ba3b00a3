"""Several processes, the way torchrun launches them: process group, DDP and FSDP2 wrappers, gathers.

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
from torch import nn

STRATEGIES = ("ddp", "fsdp")


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


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


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


# --- wrapping a model for training ---------------------------------------------------------------

class LossModel(nn.Module):
    """model + the fused LM-head loss in one forward.

    DDP synchronises gradients, and FSDP gathers parameters, only through the wrapped module's own
    forward: the loss, which reads the LM head's weight directly, has to run inside it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from .loss import causal_lm_loss

        return causal_lm_loss(self.model, input_ids, labels)


def wrap(model: nn.Module, strategy: str, device: torch.device) -> nn.Module:
    """LossModel(model), wrapped for `strategy` when several processes run: DDP over the frozen base
    (only trainable parameters are all-reduced), or FSDP2 with base and adapter sharded."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}.")
    loss_model = LossModel(model)
    if not ranks().enabled:
        return loss_model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(loss_model, device_ids=[device] if device.type == "cuda" else None)
    return _fully_shard(loss_model)


def _fully_shard(loss_model: LossModel) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    from .families import decoder_layers

    # One group per decoder layer (its adapter included), then the rest. FSDP2 wants one dtype for the
    # trainable parameters of a group, not for the frozen ones: fp32 adapter masters on a bf16 base
    # (bf16-frozen) share a layer's group.
    base = loss_model.model.get_base_model() if hasattr(loss_model.model, "get_base_model") else loss_model.model
    for layer in decoder_layers(base):
        fully_shard(layer)
    return fully_shard(loss_model)


def unwrap(wrapped: nn.Module) -> nn.Module:
    """The model inside LossModel and its DDP wrapper (FSDP2 shards LossModel in place, no wrapper)."""
    from torch.nn.parallel import DistributedDataParallel

    return (wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped).model


def is_sharded(wrapped: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(wrapped, FSDPModule)


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of a (possibly) FSDP-sharded tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


class unsharded:
    """Context: every FSDP parameter gathered in full on every process (plain tensors inside), resharded after.

    Every process must enter it (it is a collective); inside, rank 0 can save the model as usual."""

    def __init__(self, wrapped: nn.Module):
        from torch.distributed.fsdp import FSDPModule

        self.modules = [m for m in wrapped.modules() if isinstance(m, FSDPModule)] if is_sharded(wrapped) else []

    def __enter__(self):
        for m in self.modules:
            m.unshard()
        return self

    def __exit__(self, *exc):
        for m in self.modules:
            m.reshard()
        return False
