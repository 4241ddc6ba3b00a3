"""Checkpoints a killed run resumes from bit for bit: trainable weights, optimizer state, step, RNG state.

One process or DDP: OUT/checkpoint/state.pt, written by rank 0 atomically (the previous one stays until the new one
is complete). FSDP: OUT/checkpoint/ is a torch.distributed.checkpoint directory of shards, swapped in whole once
every shard is written. torch.save holds the optimizer's nested state; it is read back with weights_only=True,
which refuses anything but tensors and plain containers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from ..runtime import distributed as ddist
from ..runtime.files import atomic_write
from ..runtime.precision import rng_state, set_rng_state


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from: unreadable, or written by another run."""


def trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def exists(path: Path) -> bool:
    old = path.with_name(path.name + ".old")
    if not path.exists() and old.exists():  # killed between the two renames of a sharded save
        old.rename(path)
    return (path / "state.pt").is_file() or (path / "meta.pt").is_file()


def check_format(path: Path, sharded: bool) -> None:
    if sharded != (path / "meta.pt").is_file():
        raise CheckpointError(f"Checkpoint {path} was written with another --strategy; resume with the same strategy.")


def save(path: Path, model: nn.Module, optimizer, step: int, log_tail: list[dict], device: torch.device) -> None:
    if ddist.ranks().is_main:
        state = {
            "step": step,
            "params": {n: p.detach().clone() for n, p in trainable(model).items()},
            "optimizer": optimizer.state_dict(),
            "rng": rng_state(device),
            "log_tail": json.dumps(log_tail),
        }
        path.mkdir(parents=True, exist_ok=True)
        atomic_write(path / "state.pt", lambda tmp: torch.save(state, tmp))
    ddist.barrier()


def load(path: Path, model: nn.Module, optimizer, device: torch.device) -> tuple[int, list[dict]]:
    try:
        state = torch.load(path / "state.pt", weights_only=True, map_location=device)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"Checkpoint {path / 'state.pt'} could not be read ({reason}); delete {path} to start "
                              "over.") from None
    params = trainable(model)
    if not isinstance(state, dict) or set(state.get("params", {})) != set(params):
        raise CheckpointError(f"Checkpoint {path} was written for another method or model; use a new --out or drop "
                              "--resume.")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(state["params"][n])
    optimizer.load_state_dict(state["optimizer"])
    _restore_rng(state, device)
    return int(state["step"]), json.loads(state["log_tail"])


def save_sharded(path: Path, wrapped: nn.Module, optimizer, step: int, log_tail: list[dict],
                 device: torch.device) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    is_main = ddist.ranks().is_main
    model_state, optim_state = get_state_dict(wrapped, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    fresh, old = path.with_name(path.name + ".next"), path.with_name(path.name + ".old")
    if is_main:
        shutil.rmtree(fresh, ignore_errors=True)
    ddist.barrier()
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(fresh))
    if is_main:
        torch.save({"step": step, "rng": rng_state(device), "log_tail": json.dumps(log_tail)}, fresh / "meta.pt")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            path.rename(old)
        fresh.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    ddist.barrier()


def load_sharded(path: Path, wrapped: nn.Module, optimizer, device: torch.device) -> tuple[int, list[dict]]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    options = StateDictOptions(ignore_frozen_params=True, strict=False)  # the frozen base is not in a checkpoint
    model_state, optim_state = get_state_dict(wrapped, optimizer, options=options)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(wrapped, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=options)
    meta = torch.load(path / "meta.pt", weights_only=True)
    _restore_rng(meta, device)
    return int(meta["step"]), json.loads(meta["log_tail"])


def _restore_rng(state: dict, device: torch.device) -> None:
    rng = state.get("rng") or {"cpu": state["torch_rng"]}  # checkpoints before the CUDA state was kept
    set_rng_state({k: v.cpu() for k, v in rng.items()}, device)  # RNG states are host byte tensors
