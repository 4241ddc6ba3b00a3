"""What each step trains on and how fast: the learning-rate schedule, the data order, the optimizer."""

from __future__ import annotations

import math

import numpy as np
import torch


def lr_at(step: int, args) -> float:
    """Linear warmup to args.lr, then cosine decay to 0 at args.steps."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def batch_indices(step: int, micro: int, n_examples: int, args, world_size: int = 1, rank: int = 0) -> np.ndarray:
    """Example indices of (step, micro) for this process: its slice of the global batch (batch_size x
    world_size) that one process at that batch size would take. A fresh permutation per epoch, a pure
    function of the seed, so a resumed run needs no iterator state."""
    global_batch = args.batch_size * world_size
    start = (step * args.grad_accum + micro) * global_batch + rank * args.batch_size
    picks = []
    for k in range(start, start + args.batch_size):
        epoch, pos = divmod(k, n_examples)
        picks.append(np.random.default_rng([args.seed, epoch]).permutation(n_examples)[pos])
    return np.array(picks)


def make_optimizer(params: list[torch.Tensor], lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; the fused kernel where torch has one (on CPU it is several times faster
    than foreach)."""
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)
