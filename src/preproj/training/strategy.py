"""How a training step is spread over processes: one process, DDP or FSDP2.

The loop talks to one `Strategy` and never asks which one it has: the strategy wraps the model with its loss,
decides when gradients synchronise, sums values over processes, and saves and loads checkpoints in its format.
One process is the base class; under torchrun (WORLD_SIZE > 1) `--strategy` picks DDP or FSDP2.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from ..core.loss import causal_lm_loss
from ..runtime import distributed as ddist
from . import checkpointer

STRATEGIES = ("ddp", "fsdp")


class LossModel(nn.Module):
    """model + its loss in one forward: the fused LM-head loss for a causal LM; for preproj's own models that are not
    (the vision side's, which have `example_input`), their forward given the labels.

    DDP synchronises gradients, and FSDP gathers parameters, only through the wrapped module's own
    forward: the loss, which reads the LM head's weight directly, has to run inside it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.causal_lm = not hasattr(model, "example_input")

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.causal_lm:
            return causal_lm_loss(self.model, input_ids, labels)
        return self.model(input_ids, labels)


class Strategy:
    """One process: the model with its loss, gradients as computed, checkpoints as one file."""

    sharded = False

    def __init__(self, device: torch.device):
        self.device = device
        self.ranks = ddist.ranks()

    def wrap(self, model: nn.Module) -> nn.Module:
        return LossModel(model)

    def unwrap(self, wrapped: nn.Module) -> nn.Module:
        return wrapped.model

    def accumulating(self, wrapped: nn.Module, last_micro: bool):
        """Context of one micro-batch's forward and backward; gradients synchronise on the last one only."""
        return contextlib.nullcontext()

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over every process."""
        return ddist.sum_across(values, self.device)

    def local(self, t: torch.Tensor) -> torch.Tensor:
        """This process's part of a parameter or gradient."""
        return t

    def whole_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """module's state dict with every tensor whole, on the main process (a collective: every process calls it)."""
        return module.state_dict()

    def unsharded(self, wrapped: nn.Module):
        """Context in which every parameter is whole on every process (rank 0 can save the model as usual)."""
        return contextlib.nullcontext()

    def save_checkpoint(self, path: Path, wrapped: nn.Module, optimizer, step: int, log_tail: list[dict]) -> None:
        checkpointer.save(path, self.unwrap(wrapped), optimizer, step, log_tail, self.device)

    def load_checkpoint(self, path: Path, wrapped: nn.Module, optimizer) -> tuple[int, list[dict]]:
        checkpointer.check_format(path, sharded=False)
        return checkpointer.load(path, self.unwrap(wrapped), optimizer, self.device)


class DDP(Strategy):
    """The frozen base replicated; only trainable parameters are all-reduced, once per optimizer step."""

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(LossModel(model),
                                       device_ids=[self.device] if self.device.type == "cuda" else None)

    def unwrap(self, wrapped: nn.Module) -> nn.Module:
        return wrapped.module.model

    def accumulating(self, wrapped: nn.Module, last_micro: bool):
        return contextlib.nullcontext() if last_micro else wrapped.no_sync()


class FSDP(Strategy):
    """FSDP2: base and adapter sharded, one group per decoder layer; sharded checkpoints."""

    sharded = True

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        from ..core.families import decoder_layers

        # FSDP2 wants one dtype for the trainable parameters of a group, not for the frozen ones: fp32 adapter masters
        # on a bf16 base (bf16-frozen) share a layer's group.
        loss_model = LossModel(model)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for layer in decoder_layers(base):
            fully_shard(layer)
        return fully_shard(loss_model)

    def local(self, t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    def whole_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        # FSDP2's state_dict() is of sharded DTensors even while unsharded; an uneven shard (a vocabulary of odd
        # size on two processes) cannot even be flattened, as save_pretrained does.
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # Gathered, tied weights (embedding and LM head) come back as copies: share them again, so that
        # save_pretrained drops the duplicate as it does for the model itself.
        shared: dict[int, list[str]] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            shared.setdefault(id(p), []).append(name)
        for first, *others in shared.values():
            for name in others:
                if first in state and name in state:
                    state[name] = state[first]
        return state

    def unsharded(self, wrapped: nn.Module):
        return unsharded(wrapped)

    def save_checkpoint(self, path: Path, wrapped: nn.Module, optimizer, step: int, log_tail: list[dict]) -> None:
        checkpointer.save_sharded(path, wrapped, optimizer, step, log_tail, self.device)

    def load_checkpoint(self, path: Path, wrapped: nn.Module, optimizer) -> tuple[int, list[dict]]:
        checkpointer.check_format(path, sharded=True)
        return checkpointer.load_sharded(path, wrapped, optimizer, self.device)


def strategy_for(name: str, device: torch.device) -> Strategy:
    """The strategy for `--strategy name` in this process: one process whatever the name when WORLD_SIZE is 1."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {name!r}.")
    if not ddist.ranks().enabled:
        return Strategy(device)
    return DDP(device) if name == "ddp" else FSDP(device)


class unsharded:
    """Context: every FSDP parameter of `module` gathered in full on every process, resharded after (nothing to do
    for a module that is not sharded). Every process must enter it: it is a collective."""

    def __init__(self, module: nn.Module):
        from torch.distributed.fsdp import FSDPModule

        self.modules = [m for m in module.modules() if isinstance(m, FSDPModule)]

    def __enter__(self):
        for m in self.modules:
            m.unshard()
        return self

    def __exit__(self, *exc):
        for m in self.modules:
            m.reshard()
        return False
