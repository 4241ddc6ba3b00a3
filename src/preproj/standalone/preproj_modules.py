"""preproj's pre-projection and content skip around a transformers model's attention layers, and the block changes
preproj compares the skip with; the modeling files an export carries (modeling_preproj.py for language models,
modeling_preproj_vision.py for vision runs) import `adapt` from here. It needs torch only.

    x̂  = Norm(x)                                 the block's own attention-input norm
    x̃  = x̂ + W_down · act(W_up · x̂)             pre-projection, before Q/K/V (and before RoPE)
    out = x + attn(x̃) + W_skip · x̃              content skip, added to the attention output

In blocks that norm the attention output before the residual add (Gemma 2/3, OLMo 2) the skip is added after that
norm. K and V come from the base attention on x̃ with the base shapes, so the K/V cache is the base model's.
The block changes hook into the base attention:

    y ⊙ σ(x̂ W_g)               gated attention: y, the input of the output projection (per channel or per head)
    V'ₙ = λ₁ V₁ + λ₂ Vₙ         value residual: the value projection's output mixed with the first layer's
    x ← x + ½ W_down act(W_up RMSNorm(x))    pre-attention MLP, on the residual stream before the block
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


class PreProjection(nn.Module):
    """x̃ = x̂ + W_down · act(W_up · x̂): a residual MLP applied to each position alone, no bias."""

    def __init__(self, d: int, hidden: int, activation: str):
        super().__init__()
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.act = ACTIVATIONS[activation]

    def forward(self, x_hat: torch.Tensor) -> torch.Tensor:
        x = _as(x_hat, self.up.weight.dtype)
        delta = F.linear(self.act(F.linear(x, self.up.weight)), self.down.weight)
        return x_hat + _as(delta, x_hat.dtype)


class PreAttentionMLP(nn.Module):
    """x + ½ W_down · act(W_up · RMSNorm(x)), on the residual stream before the block."""

    def __init__(self, d: int, hidden: int, activation: str, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=eps)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(_as(x, self.up.weight.dtype))
        return x + _as(0.5 * F.linear(self.act(F.linear(h, self.up.weight)), self.down.weight), x.dtype)


class FirstValues:
    """The first adapted layer's values in the current forward pass."""

    tensor = None


class PreProjAttention(nn.Module):
    """The base attention (kept as `base_layer`) run on x̃, with the skip term W_skip · x̃ added to its output, or
    handed to the SkipAfterNorm that follows when the block norms the attention output; and the block changes."""

    def __init__(self, base_layer: nn.Module, d: int, spec: dict, first_layer: bool):
        super().__init__()
        parts = spec["mode"].split("+")
        self.base_layer = base_layer
        self.preproj = PreProjection(d, spec["hidden_width"], spec["activation"]) if "preproj" in parts else None
        self.skip = nn.Linear(d, d, bias=False) if "skip" in parts else None
        gate = {"gate": spec.get("attention_width"), "gate-head": spec.get("heads")}
        width = next((gate[p] for p in parts if p in gate), None)
        self.attn_gate = nn.Linear(d, width, bias=False) if width else None
        self.value_mix = nn.Parameter(torch.zeros(2)) if "value-residual" in parts and not first_layer else None
        self.pre_mlp = PreAttentionMLP(d, spec["hidden_width"], spec["activation"], spec.get("norm_eps", 1e-6)) \
            if "pre-mlp" in parts else None
        self.value_residual = "value-residual" in parts
        self.defer_skip = False
        self.deferred = None
        self.gate_input = None
        self.values = None

    def hook_into(self, layer: nn.Module, spec: dict, values: FirstValues) -> None:
        if self.attn_gate is not None:
            getattr(self.base_layer, spec["output_proj"]).register_forward_pre_hook(self.gate_output)
        if self.value_residual:
            self.values = values
            getattr(self.base_layer, spec["value_proj"]).register_forward_hook(self.mix_values)
        if self.pre_mlp is not None:
            layer.register_forward_pre_hook(self.pre_mlp_input, with_kwargs=True)

    def gate_output(self, module: nn.Module, args: tuple):
        y, weight = args[0], self.attn_gate.weight
        gate = torch.sigmoid(F.linear(_as(self.gate_input, weight.dtype), weight))
        if gate.shape[-1] != y.shape[-1]:  # one gate per head
            gated = (y.unflatten(-1, (gate.shape[-1], -1)) * gate.unsqueeze(-1)).flatten(-2)
        else:
            gated = y * gate
        return (_as(gated, y.dtype), *args[1:])

    def mix_values(self, module: nn.Module, args: tuple, values: torch.Tensor):
        if self.value_mix is None:  # the first adapted layer: its values are the ones mixed in
            self.values.tensor = values
            return None
        mix = self.value_mix
        return _as(mix[0] * self.values.tensor + mix[1] * values, values.dtype)

    def pre_mlp_input(self, layer: nn.Module, args: tuple, kwargs: dict):
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": self.pre_mlp(kwargs["hidden_states"])}
        return (self.pre_mlp(args[0]), *args[1:]), kwargs

    def forward(self, *args, **kwargs):
        x_hat = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        x_tilde = self.preproj(x_hat) if self.preproj is not None else x_hat
        if "hidden_states" in kwargs:
            kwargs = {**kwargs, "hidden_states": x_tilde}
        else:
            args = (x_tilde, *args[1:])
        self.gate_input = x_hat if self.attn_gate is not None else None
        try:
            out = self.base_layer(*args, **kwargs)
        finally:
            self.gate_input = None
        if self.skip is None:
            return out
        attn_out = out[0] if isinstance(out, tuple) else out
        skip = _as(F.linear(_as(x_tilde, self.skip.weight.dtype), self.skip.weight), attn_out.dtype)
        if self.defer_skip:
            self.deferred = skip
            return out
        return (out[0] + skip, *out[1:]) if isinstance(out, tuple) else out + skip


class SkipAfterNorm(nn.Module):
    """The block's attention-output norm (kept as `base_layer`), with the content skip added after it."""

    def __init__(self, base_layer: nn.Module, attention: PreProjAttention):
        super().__init__()
        self.base_layer = base_layer
        self._attention = [attention]  # a plain reference: the attention is registered in its own layer

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        out = self.base_layer(hidden_states, *args, **kwargs)
        attention = self._attention[0]
        skip, attention.deferred = attention.deferred, None
        return out if skip is None else out + skip


def adapt(model: nn.Module, spec: dict, d: int) -> None:
    """Wrap the attention of each layer `spec` names in `model` as preproj's `attach` does, with its block changes.
    The wrappers take the attributes' names that `attach` gives them, so the weights load by name."""
    layers = model
    for name in spec["decoder_layers"].split("."):
        layers = getattr(layers, name)
    values = FirstValues()
    for i in spec["adapted_layers"]:
        layer = layers[i]
        attention = PreProjAttention(getattr(layer, spec["attention"]), d, spec,
                                     first_layer=i == spec["adapted_layers"][0])
        attention.hook_into(layer, spec, values)
        setattr(layer, spec["attention"], attention)
        if spec["skip_after"] and attention.skip is not None:
            attention.defer_skip = True
            setattr(layer, spec["skip_after"], SkipAfterNorm(getattr(layer, spec["skip_after"]), attention))
