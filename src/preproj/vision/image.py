"""A small vision transformer for images, to train from scratch with the modules built in.

Built from transformers' Pixtral vision encoder, which already is what the method needs: a patch embedding, pre-norm
blocks whose attention reads the block's own RMSNorm, bidirectional attention, and position entering only inside
attention, as 2-D axial RoPE over (row, column) applied to Q and K after their projections. The modules therefore
sit where they sit in text (the family table's `pixtral` row): the pre-projection on the attention-input norm's
output, before Q, K and V and before RoPE; the content skip beside the attention branch. A mean over the patches and
a linear head classify.

Because position enters only through RoPE and the pooling is a mean, the model is invariant to a permutation of its
patches that carries their positions along (`forward(..., order=, keep_positions=False)`); permuting the patches but
keeping the positions in place (`keep_positions=True`) is the position-shuffle probe: what accuracy is left is
carried by content that does not depend on where it is.

`preproj pretrain --task mnist` trains it through the text side's loop (training/scratch_vision.py); a trained model
is a directory (directory.py). `VisionShape(position="learned")` adds a learned absolute position embedding instead
(pixtral.py), with which the modules read position. `preproj export` writes a trained one as a transformers
directory (standalone/modeling_preproj_vision.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .directory import SavedAsDirectory
from .pixtral import LearnedPosition, check_shape, grid_positions, no_rotation, pixtral_config, reorder


@dataclass(frozen=True)
class VisionShape:
    """The classifier's shape: images of `image_size` square with `channels` channels, cut into `patch_size`
    patches."""

    image_size: int = 28
    patch_size: int = 4
    channels: int = 1
    layers: int = 4
    d_model: int = 128
    heads: int = 4
    intermediate: int | None = None
    """MLP width (default 8/3 d rounded up to a multiple of 16, as text's from-scratch models)."""
    classes: int = 10
    position: str = "rope"
    """rope (2-D RoPE inside attention) or learned (an absolute embedding added before the blocks; pixtral.py)."""

    def __post_init__(self):
        check_shape(self, ("image_size", "patch_size", "channels", "layers", "d_model", "heads", "classes"))
        if self.image_size % self.patch_size:
            raise ValueError(f"patches of {self.patch_size} pixels do not tile a {self.image_size}-pixel image: "
                             f"choose a patch size that divides {self.image_size}.")
        if self.d_model % self.heads or (self.d_model // self.heads) % 4:
            raise ValueError(f"d_model {self.d_model} must split into {self.heads} heads of a size divisible by 4 "
                             "(2-D RoPE gives each axis half of every head's rotated pairs).")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens(self) -> int:
        """Tokens the blocks see: one per patch."""
        return self.grid ** 2

    given_tokens = tokens  # every token is given (video's next-frame objective also has mask tokens)

    def config(self):
        return pixtral_config(self, self.image_size)


class ImageClassifier(SavedAsDirectory, nn.Module):
    """Patches -> Pixtral's pre-norm blocks with 2-D RoPE -> mean over patches -> RMSNorm -> linear head."""

    model_type = "preproj-image-classifier"
    shape_type = VisionShape

    def __init__(self, shape: VisionShape):
        super().__init__()
        from transformers import PixtralVisionModel

        self.shape = shape
        self.encoder = PixtralVisionModel(shape.config())
        self.config = self.encoder.config  # model_type "pixtral": the family table's row
        self.norm = nn.RMSNorm(shape.d_model, eps=1e-5)  # Pixtral's own norms' eps
        self.head = nn.Linear(shape.d_model, shape.classes)
        if shape.position == "learned":
            self.position = LearnedPosition(shape.tokens, shape.d_model)
        self.register_buffer("positions", grid_positions(shape.grid, shape.grid), persistent=False)  # (row, column)

    def example_input(self) -> dict:
        """One blank image: what the family table's structural check runs the model on."""
        s, p = self.shape, next(self.parameters())
        return {"pixel_values": torch.zeros(1, s.channels, s.image_size, s.image_size, device=p.device, dtype=p.dtype)}

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None, *,
                order: torch.Tensor | None = None, keep_positions: bool = False) -> torch.Tensor:
        """Logits (B, classes), or the mean cross-entropy when `labels` are given. uint8 pixels are read as
        value / 255. `order`: a permutation of the patches (row-major), (patches,) or one per image (batch, patches);
        their RoPE positions move with them, or with keep_positions stay where they were."""
        s, encoder = self.shape, self.encoder
        if pixel_values.ndim != 4 or pixel_values.shape[1:] != (s.channels, s.image_size, s.image_size):
            raise ValueError(f"images must be (batch, {s.channels}, {s.image_size}, {s.image_size}), got "
                             f"{tuple(pixel_values.shape)}.")
        if pixel_values.dtype == torch.uint8:
            pixel_values = pixel_values / 255.0
        patches = encoder.patch_conv(pixel_values.to(encoder.patch_conv.weight.dtype))  # (B, d, grid, grid)
        x = encoder.ln_pre(patches.flatten(2).transpose(1, 2))  # (B, grid², d), row-major
        x, slots = reorder(x, order, keep_positions)
        if s.position == "learned":
            x = self.position(x, slots)
            cos, sin = no_rotation(x.shape[1], s.d_model // s.heads, x)
        else:
            cos, sin = encoder.patch_positional_embedding(x, self.positions[slots])
        hidden = encoder.transformer(x, attention_mask=None, position_embeddings=(cos, sin)).last_hidden_state
        logits = self.head(self.norm(hidden.mean(dim=1)))
        return logits if labels is None else F.cross_entropy(logits.float(), labels)
