"""A vision transformer trained from scratch by `preproj pretrain --task mnist|moving-mnist|moving-mnist-direction`,
with preproj's pre-projection and content skip around its attention, as a transformers model.

Written into a model directory by `preproj export`, beside preproj_modules.py (the modules and the wrapper); the two
need torch and transformers only. Load the directory with `AutoModel.from_pretrained(path, trust_remote_code=True)`
(an image classifier also with AutoModelForImageClassification, a clip classifier with
AutoModelForVideoClassification). The body is transformers' Pixtral vision encoder: a patch embedding (over
tubelets, frames x pixels x pixels, for clips), pre-norm blocks, and position entering only inside attention as
axial RoPE over (row, column), or over (time, row, column) for clips, so the modules on each block's attention-input
norm see no position (unless the run chose a learned position embedding, added before the blocks):

    image       patches -> blocks -> mean over tokens -> RMSNorm -> linear head: class logits
    direction   the clip's tubelets -> blocks -> mean over tokens -> RMSNorm -> linear head: class logits
    next-frame  the context's tubelets, then one learned mask token per tubelet to predict -> blocks -> RMSNorm ->
                linear head: each predicted tubelet's pixel logits, as frames (batch, frames - context, channels,
                size, size); the loss is the per-pixel binary cross-entropy

Pixels are floats, or uint8 read as value / 255. config.json's `vision` entry is the run's shape, `pixtral` its
encoder's config, and `preproj` says which layers are adapted and the modules' sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PixtralVisionConfig, PixtralVisionModel, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from .preproj_modules import adapt

ROPE_THETA = 10000.0


class PreProjVisionConfig(PretrainedConfig):
    """`vision`: the run's shape (`kind` image or clip, and its fields); `pixtral`: the encoder's
    PixtralVisionConfig; `preproj`: the modules, as a language model's export gives them."""

    model_type = "preproj_vision"

    def __init__(self, vision: dict | None = None, pixtral: dict | None = None, preproj: dict | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.vision, self.pixtral, self.preproj = vision or {}, pixtral or {}, preproj or {}


@dataclass
class VisionOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class LearnedPosition(nn.Module):
    def __init__(self, slots: int, d_model: int):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(slots, d_model))


def grid_positions(*sizes: int) -> torch.Tensor:
    """Each token's coordinates (tokens, len(sizes)), row-major: the order of the patch embedding's tokens."""
    axes = torch.meshgrid(*(torch.arange(n) for n in sizes), indexing="ij")
    return torch.stack([a.flatten() for a in axes], dim=-1)


def rope_3d(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) for (time, row, column) positions: each head's rotated pairs dealt to the three axes in turn (pair j
    to axis j mod 3), each axis with its own geometric ladder of frequencies from 1 down to 1/theta."""
    pairs = head_dim // 2
    axis = torch.arange(pairs) % 3
    rank = torch.arange(pairs) // 3
    inv_freq = ROPE_THETA ** (-rank.double() / torch.bincount(axis, minlength=3)[axis].double())
    angles = positions[:, axis].double() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


class PreProjVisionModel(PreTrainedModel):
    config_class = PreProjVisionConfig
    main_input_name = "pixel_values"

    def __init__(self, config: PreProjVisionConfig):
        super().__init__(config)
        s, d = config.vision, config.vision["d_model"]
        self.encoder = PixtralVisionModel(PixtralVisionConfig.from_dict(config.pixtral))
        if s["kind"] == "clip":
            kernel = (s["tubelet"], s["patch_size"], s["patch_size"])
            self.encoder.patch_conv = nn.Conv3d(s["channels"], d, kernel_size=kernel, stride=kernel, bias=False)
        self.norm = nn.RMSNorm(d, eps=1e-5)
        next_frame = s.get("objective") == "next-frame"
        self.head = nn.Linear(d, s["tubelet"] * s["patch_size"] ** 2 * s["channels"] if next_frame else s["classes"])
        if next_frame:
            self.mask = nn.Parameter(torch.zeros(d))
        if s["position"] == "learned":
            self.position = LearnedPosition(len(self._positions()), d)
        adapt(self, config.preproj, d)
        self.post_init()

    def _positions(self) -> torch.Tensor:
        s = self.config.vision
        if s["kind"] == "image":
            grid = s["image_size"] // s["patch_size"]
            return grid_positions(grid, grid)
        grid = s["size"] // s["patch_size"]
        return grid_positions(s["frames"] // s["tubelet"], grid, grid)

    def _checked(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The input as floats, (batch, channels, size, size) or (batch, frames, channels, size, size)."""
        s = self.config.vision
        if s["kind"] == "image":
            shape = (s["channels"], s["image_size"], s["image_size"])
        else:
            frames = s["context"] if s["objective"] == "next-frame" else s["frames"]
            shape = (frames, s["channels"], s["size"], s["size"])
            if pixel_values.ndim == 4 and s["channels"] == 1:
                pixel_values = pixel_values.unsqueeze(2)
        if tuple(pixel_values.shape[1:]) != shape:
            raise ValueError(f"pixel_values must be (batch, {', '.join(map(str, shape))}), got "
                             f"{tuple(pixel_values.shape)}.")
        return pixel_values / 255.0 if pixel_values.dtype == torch.uint8 else pixel_values

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None, **kwargs) -> VisionOutput:
        """`pixel_values`: images (batch, channels, size, size), or clips (batch, frames, [channels,] size, size):
        the context's frames for next-frame (labels: the frames that follow), the whole clip for direction."""
        s, encoder = self.config.vision, self.encoder
        x = self._checked(pixel_values)
        if s["kind"] == "clip":
            x = x.transpose(1, 2)  # (batch, channels, frames, size, size)
        x = encoder.patch_conv(x.to(encoder.patch_conv.weight.dtype))
        x = encoder.ln_pre(x.flatten(2).transpose(1, 2))  # (batch, given tokens, d), row-major
        given, positions = x.shape[1], self._positions()
        if hasattr(self, "mask"):
            x = torch.cat([x, self.mask.to(x.dtype).expand(x.shape[0], len(positions) - given, -1)], dim=1)
        head_dim = s["d_model"] // s["heads"]
        if s["position"] == "learned":
            x = x + self.position.table.to(x.dtype)
            cos, sin = x.new_ones(x.shape[1], head_dim), x.new_zeros(x.shape[1], head_dim)
        elif s["kind"] == "image":
            cos, sin = encoder.patch_positional_embedding(x, positions.to(x.device))
        else:
            cos, sin = (t.to(device=x.device, dtype=x.dtype) for t in rope_3d(positions, head_dim))
        hidden = encoder.transformer(x, attention_mask=None, position_embeddings=(cos, sin)).last_hidden_state
        if not hasattr(self, "mask"):
            logits = self.head(self.norm(hidden.mean(dim=1)))
            loss = None if labels is None else F.cross_entropy(logits.float(), labels)
            return VisionOutput(loss=loss, logits=logits)
        logits = self._frames(self.head(self.norm(hidden[:, given:])))
        loss = None
        if labels is not None:
            target = labels / 255.0 if labels.dtype == torch.uint8 else labels
            loss = F.binary_cross_entropy_with_logits(logits.float(), target.reshape(logits.shape).float())
        return VisionOutput(loss=loss, logits=logits)

    def _frames(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per-token tubelet logits -> frames (batch, frames, channels, size, size)."""
        s, b = self.config.vision, tokens.shape[0]
        grid, p, c = s["size"] // s["patch_size"], s["patch_size"], s["channels"]
        t = tokens.shape[1] // grid ** 2
        x = tokens.reshape(b, t, grid, grid, s["tubelet"], p, p, c)
        return x.permute(0, 1, 4, 7, 2, 5, 3, 6).reshape(b, t * s["tubelet"], c, s["size"], s["size"])
