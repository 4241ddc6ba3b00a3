"""How position enters a vision model: `rope` (the default), rotations of Q and K inside attention, where neither
module sees it; or `learned`, one learned vector per token slot added to the tokens before the blocks, as the
original ViT does. Position is then part of the residual stream, and the attention-input norm that the modules read
carries it: with a learned embedding the modules are no longer position-agnostic."""

from __future__ import annotations

import torch
from torch import nn

POSITIONS = ("rope", "learned")


def check_position(position: str) -> None:
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {', '.join(POSITIONS)}, got {position!r}.")


class LearnedPosition(nn.Module):
    """A (slots, d) table; the tokens at slot indices `slots` get their rows added."""

    def __init__(self, slots: int, d_model: int):
        super().__init__()
        self.table = nn.Parameter(torch.randn(slots, d_model) * 0.02)

    def forward(self, x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return x + self.table[slots].to(x.dtype)


def no_rotation(tokens: int, head_dim: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of a zero angle: RoPE that leaves Q and K as they are."""
    return (torch.ones(tokens, head_dim, dtype=like.dtype, device=like.device),
            torch.zeros(tokens, head_dim, dtype=like.dtype, device=like.device))
