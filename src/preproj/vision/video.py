"""A small video transformer to train from scratch with the modules built in: Moving MNIST clips cut into tubelets
(`tubelet` frames x `patch_size` x `patch_size` pixels, one token each), Pixtral's pre-norm blocks, and position
entering only inside attention as 3-D axial RoPE over (time, row, column), so that the modules sit where they sit in
text and in preproj.vision (the family table's `pixtral` row) and see no position.

Two objectives on one body:

- **next-frame**: the model is given the first `context` frames; the tokens of the frames that follow are one learned
  mask embedding each, told apart only by their RoPE positions, and the head turns each into its tubelet's pixel
  logits. The loss is the per-pixel binary cross-entropy against the true frames (pixels as value / 255), as
  Srivastava et al. (2015) scored Moving MNIST.
- **direction**: the whole clip is given, and a mean over the tokens classifies which way its first digit moves
  (preproj.images.direction_class; `pretrain` gives this task one-digit clips): a task where the order of the frames
  carries the answer.

3-D RoPE: each head's rotated pairs are dealt to the three axes in turn (pair j to axis j mod 3), each axis with its own
geometric ladder of frequencies from 1 down to 1/theta, as Pixtral deals its pairs to rows and columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .directory import SavedAsDirectory
from .pixtral import LearnedPosition, check_shape, grid_positions, no_rotation, pixtral_config, reorder

OBJECTIVES = ("next-frame", "direction")
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class ClipShape:
    """Clips of `frames` frames of `size` x `size` pixels with `channels` channels, cut into tubelets."""

    objective: str = "next-frame"
    frames: int = 16
    context: int = 10
    """next-frame: frames given; the rest are predicted."""
    size: int = 64
    tubelet: int = 2
    """Frames per token."""
    patch_size: int = 8
    channels: int = 1
    layers: int = 4
    d_model: int = 128
    heads: int = 4
    intermediate: int | None = None
    """MLP width (default 8/3 d rounded up to a multiple of 16)."""
    classes: int = 4
    position: str = "rope"
    """rope (3-D RoPE inside attention) or learned (an absolute embedding added before the blocks; pixtral.py)."""

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}.")
        check_shape(self, ("frames", "context", "size", "tubelet", "patch_size", "channels", "layers", "d_model",
                           "heads", "classes"))
        if self.size % self.patch_size:
            raise ValueError(f"patches of {self.patch_size} pixels do not tile a {self.size}-pixel frame: choose a "
                             f"patch size that divides {self.size}.")
        if self.frames % self.tubelet or (self.objective == "next-frame" and self.context % self.tubelet):
            raise ValueError(f"tubelets of {self.tubelet} frames must tile the clip ({self.frames} frames) and the "
                             f"context ({self.context}): choose a tubelet depth that divides both.")
        if self.objective == "next-frame" and not self.context < self.frames:
            raise ValueError(f"next-frame prediction needs frames to predict: context {self.context} must be below "
                             f"frames {self.frames}.")
        head_dim = self.d_model // self.heads
        if self.d_model % self.heads or head_dim % 2 or head_dim < 6:
            raise ValueError(f"d_model {self.d_model} must split into {self.heads} heads of an even size of at least 6 "
                             "(3-D RoPE deals each head's rotated pairs to time, row and column).")

    @property
    def grid(self) -> int:
        return self.size // self.patch_size

    @property
    def given_frames(self) -> int:
        return self.context if self.objective == "next-frame" else self.frames

    @property
    def tokens(self) -> int:
        """Tokens the blocks see: every tubelet of the clip (next-frame: the predicted ones as mask tokens)."""
        return self.frames // self.tubelet * self.grid ** 2

    @property
    def given_tokens(self) -> int:
        """Tokens made from the given frames (the rest, for next-frame, are mask tokens)."""
        return self.given_frames // self.tubelet * self.grid ** 2

    def config(self):
        return pixtral_config(self, self.size)


def rope_3d(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (tokens, head_dim), for (time, row, column) positions (tokens, 3), laid out for
    transformers' rotate_half (pair j rotates dimensions j and j + head_dim / 2)."""
    pairs = head_dim // 2
    axis = torch.arange(pairs, device=positions.device) % 3
    rank = torch.arange(pairs, device=positions.device) // 3
    per_axis = torch.bincount(axis, minlength=3)
    inv_freq = ROPE_THETA ** (-rank.double() / per_axis[axis].double())  # (pairs,)
    angles = positions[:, axis].double() * inv_freq  # (tokens, pairs)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


class ClipTransformer(SavedAsDirectory, nn.Module):
    """Tubelets -> Pixtral's pre-norm blocks with 3-D RoPE -> per-token pixel logits (next-frame) or a class."""

    model_type = "preproj-clip-transformer"
    shape_type = ClipShape

    def __init__(self, shape: ClipShape):
        super().__init__()
        from transformers import PixtralVisionModel

        self.shape = s = shape
        self.encoder = PixtralVisionModel(s.config())  # its blocks, norms and initialisation; the 2-D patch conv and
        self.encoder.patch_conv = nn.Conv3d(s.channels, s.d_model, kernel_size=(s.tubelet, s.patch_size, s.patch_size),
                                            stride=(s.tubelet, s.patch_size, s.patch_size), bias=False)  # RoPE unused
        self.config = self.encoder.config  # model_type "pixtral": the family table's row
        self.norm = nn.RMSNorm(s.d_model, eps=1e-5)
        if s.objective == "next-frame":
            self.mask = nn.Parameter(torch.randn(s.d_model) * 0.02)
            self.head = nn.Linear(s.d_model, s.tubelet * s.patch_size ** 2 * s.channels)
        else:
            self.head = nn.Linear(s.d_model, s.classes)
        if s.position == "learned":
            self.position = LearnedPosition(s.tokens, s.d_model)
        self.register_buffer("positions", grid_positions(s.frames // s.tubelet, s.grid, s.grid),
                             persistent=False)  # (time, row, column)

    def example_input(self) -> dict:
        """One blank clip: what the family table's structural check runs the model on."""
        s, p = self.shape, next(self.parameters())
        return {"clips": torch.zeros(1, s.given_frames, s.channels, s.size, s.size, device=p.device, dtype=p.dtype)}

    def forward(self, clips: torch.Tensor, labels: torch.Tensor | None = None, *, order: torch.Tensor | None = None,
                keep_positions: bool = False) -> torch.Tensor:
        """Logits, or the mean loss when `labels` are given. `clips`: (batch, frames, [channels,] size, size), the
        `context` first frames for next-frame (labels: the frames that follow) or the whole clip for direction
        (labels: classes); uint8 pixels are read as value / 255. next-frame logits are (batch, frames - context,
        channels, size, size). `order` permutes the given tokens as in preproj.vision."""
        s, encoder = self.shape, self.encoder
        clips = self._checked(clips, s.given_frames, "clips")
        x = encoder.patch_conv(clips.transpose(1, 2).to(encoder.patch_conv.weight.dtype))  # (B, d, T, grid, grid)
        x = encoder.ln_pre(x.flatten(2).transpose(1, 2))  # (B, given tokens, d), (time, row, column)-major
        given = x.shape[1]
        x, slots = reorder(x, order, keep_positions)
        if s.objective == "next-frame":  # the predicted tubelets: mask tokens at the slots after the given ones
            x = torch.cat([x, self.mask.to(x.dtype).expand(x.shape[0], s.tokens - given, -1)], dim=1)
            slots = torch.cat([slots, torch.arange(given, s.tokens, device=x.device)])
        if s.position == "learned":
            x = self.position(x, slots)
            cos, sin = no_rotation(x.shape[1], s.d_model // s.heads, x)
        else:
            cos, sin = (t.to(x.dtype) for t in rope_3d(self.positions[slots], s.d_model // s.heads))
        hidden = encoder.transformer(x, attention_mask=None, position_embeddings=(cos, sin)).last_hidden_state
        if s.objective == "direction":
            logits = self.head(self.norm(hidden.mean(dim=1)))
            return logits if labels is None else F.cross_entropy(logits.float(), labels)
        logits = self._frames(self.head(self.norm(hidden[:, given:])))
        if labels is None:
            return logits
        target = self._checked(labels, s.frames - s.context, "labels").float()
        return F.binary_cross_entropy_with_logits(logits.float(), target)

    def _checked(self, clips: torch.Tensor, frames: int, what: str) -> torch.Tensor:
        """(B, frames, channels, size, size), uint8 read as value / 255; a one-channel clip may leave channels out."""
        s = self.shape
        if clips.ndim == 4 and s.channels == 1:
            clips = clips.unsqueeze(2)
        if clips.ndim != 5 or clips.shape[1:] != (frames, s.channels, s.size, s.size):
            raise ValueError(f"{what} must be (batch, {frames}, {s.channels}, {s.size}, {s.size}), got "
                             f"{tuple(clips.shape)}.")
        return clips / 255.0 if clips.dtype == torch.uint8 else clips

    def _frames(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per-token tubelet logits (B, T x grid x grid, tubelet x p x p x channels) -> (B, T x tubelet, channels,
        size, size)."""
        s, b = self.shape, tokens.shape[0]
        t = tokens.shape[1] // s.grid ** 2
        x = tokens.reshape(b, t, s.grid, s.grid, s.tubelet, s.patch_size, s.patch_size, s.channels)
        return x.permute(0, 1, 4, 7, 2, 5, 3, 6).reshape(b, t * s.tubelet, s.channels, s.size, s.size)
