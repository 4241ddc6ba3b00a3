"""What both vision models share: Pixtral's blocks configured from a shape, the shape's common checks, and how
position enters.

Position enters as `rope` (the default), rotations of Q and K inside attention, where neither module sees it; or as
`learned`, one learned vector per token slot added to the tokens before the blocks, as the original ViT does.
Position is then part of the residual stream, and the attention-input norm that the modules read carries it: with a
learned embedding the modules are no longer position-agnostic.
"""

from __future__ import annotations

import torch
from torch import nn

POSITIONS = ("rope", "learned")


def check_shape(shape, positive: tuple[str, ...]) -> None:
    """The checks every vision shape takes: its position word and its counts."""
    if shape.position not in POSITIONS:
        raise ValueError(f"position must be one of {', '.join(POSITIONS)}, got {shape.position!r}.")
    for name in positive:
        value = getattr(shape, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def pixtral_config(shape, image_size: int):
    """The PixtralVisionConfig of a shape's blocks; the MLP width defaults to 8/3 d rounded up to a multiple of 16, as
    text's from-scratch models."""
    from transformers import PixtralVisionConfig

    width = shape.intermediate or -(-(8 * shape.d_model // 3) // 16) * 16
    return PixtralVisionConfig(hidden_size=shape.d_model, intermediate_size=width, num_hidden_layers=shape.layers,
                               num_attention_heads=shape.heads, head_dim=shape.d_model // shape.heads,
                               num_channels=shape.channels, image_size=image_size, patch_size=shape.patch_size)


def grid_positions(*sizes: int) -> torch.Tensor:
    """Each token's coordinates (tokens, len(sizes)) on a grid of `sizes`, in row-major order (the order of the tokens
    a patch embedding flattens)."""
    axes = torch.meshgrid(*(torch.arange(n) for n in sizes), indexing="ij")
    return torch.stack([a.flatten() for a in axes], dim=-1)


def reorder(x: torch.Tensor, order: torch.Tensor | None, keep_positions: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens x (B, n, d) in `order`, and each one's position slot (n,). One permutation (n,) for the batch moves
    the positions with the tokens, or with keep_positions leaves them in place; one per input (B, n) must keep them,
    as Pixtral's attention takes one set of positions per batch."""
    slots = torch.arange(x.shape[1], device=x.device)
    if order is None:
        return x, slots
    if order.ndim == 2:
        if not keep_positions:
            raise ValueError("a permutation per input (order of shape (batch, tokens)) needs keep_positions=True; to "
                             "carry positions along, give one permutation (tokens,) for the whole batch.")
        return x.gather(1, order[..., None].expand(-1, -1, x.shape[-1])), slots
    return x[:, order], slots if keep_positions else order


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
