"""The two modules (docs/method.md; `PreProjAdapter` holds one adapter's pair) and the wrappers that put them
around an attention layer: `PreProjAttention` here, `preproj.peft.layer` for PEFT.

    x̂  = Norm(x)                                 the block's own attention-input norm
    x̃  = x̂ + W_down · act(W_up · x̂)             pre-projection, before Q/K/V (and before RoPE)
    out = x + attn(x̃) + W_skip · x̃              content skip, added to the attention output

Adding the skip term to the attention module's output is exact for sequential blocks
(x + attn_out) and for parallel-residual blocks (x + attn_out + mlp_out) alike.

The same wrapper carries the block changes that from-scratch runs compare the skip with (docs/guide/variants.md),
each reaching into the block through a hook that `attach` installs and `detach` removes:

    y   = attn(x̃) before its output projection;  y ⊙ σ(x̂ W_g)         gated attention (per channel or per head)
    V'ₙ = λ₁ V₁ + λ₂ Vₙ                                                  value residual (layers after the first)
    x   = x + ½ W_down · act(W_up · Norm(x))                            pre-attention MLP, on the residual stream
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .config import PreProjConfig

_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A same-dtype .to() is a no-op that still costs a dispatcher call; at batch-1 decoding these
    # calls are a visible share of the adapter's overhead.
    return x if x.dtype == dtype else x.to(dtype)


class PreProjection(nn.Module):
    """x̃ = x̂ + W_down · act(W_up · x̂): a residual MLP, position-agnostic, no bias."""

    def __init__(self, d: int, hidden: int, activation: str = "silu", dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        self.up = nn.Linear(d, hidden, bias=False, dtype=dtype, device=device)  # (hidden, d)
        self.down = nn.Linear(hidden, d, bias=False, dtype=dtype, device=device)  # (d, hidden)
        self.activation = activation
        self._act = _ACTIVATIONS[activation]

    def extra_repr(self) -> str:
        return f"activation={self.activation}"

    def forward(self, x_hat: torch.Tensor) -> torch.Tensor:  # (B, T, d) -> (B, T, d)
        # Adapter weights may be fp32 masters on a bf16 base: compute in the adapter's dtype
        # (autocast still picks the matmul dtype) and hand the base its own dtype back.
        x = _as(x_hat, self.up.weight.dtype)
        delta = F.linear(self._act(F.linear(x, self.up.weight)), self.down.weight)  # (B, T, hidden) -> (B, T, d)
        return x_hat + _as(delta, x_hat.dtype)


class PreAttentionMLP(nn.Module):
    """x + ½ W_down · act(W_up · Norm(x)): a Macaron-style half MLP with its own RMSNorm, on the residual stream
    before the block's attention; the pre-projection's shape, so that it adds the same matmul parameters."""

    def __init__(self, d: int, hidden: int, activation: str, eps: float, dtype: torch.dtype, device=None):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=eps, dtype=dtype, device=device)
        self.up = nn.Linear(d, hidden, bias=False, dtype=dtype, device=device)
        self.down = nn.Linear(hidden, d, bias=False, dtype=dtype, device=device)
        self._act = _ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d) -> (B, T, d)
        h = self.norm(_as(x, self.up.weight.dtype))
        return x + _as(0.5 * F.linear(self._act(F.linear(h, self.up.weight)), self.down.weight), x.dtype)


class FirstValues:
    """The first adapted layer's values in the current forward pass, shared by every layer's value residual."""

    tensor: torch.Tensor | None = None


class PreProjAdapter(nn.Module):
    """One adapter's modules for one attention layer: the pre-projection and/or the content skip, and any block
    changes (gate, value residual, pre-MLP), which reach into the block through the hooks of `hook_into`.

    `around` runs a base attention module with them. The wrapper never depends on the attention's
    signature: it takes `hidden_states` (the keyword, else the first positional argument), replaces it
    by x̃ and passes everything else through untouched. K and V are computed by the base layer from x̃
    with the base shapes, so the K/V cache is exactly the base model's.
    """

    def __init__(self, d: int, config: PreProjConfig, device=None, *, attention_width: int | None = None,
                 heads: int | None = None, first_layer: bool = False, norm_eps: float = 1e-6):
        super().__init__()
        dtype = config.torch_dtype
        self.preproj = (
            PreProjection(d, config.hidden_width(d), config.activation, dtype=dtype, device=device)
            if config.use_preproj
            else None
        )
        self.skip = nn.Linear(d, d, bias=False, dtype=dtype, device=device) if config.use_skip else None  # (d, d)
        gate_width = {"elementwise": attention_width, "head": heads, None: None}[config.gate]
        self.attn_gate = nn.Linear(d, gate_width, bias=False, dtype=dtype, device=device) if gate_width else None
        self.value_mix = nn.Parameter(torch.empty(2, dtype=dtype, device=device)) \
            if config.use_value_residual and not first_layer else None  # (λ₁, λ₂)
        self.pre_mlp = PreAttentionMLP(d, config.hidden_width(d), config.activation, norm_eps, dtype, device) \
            if config.use_pre_mlp else None
        self.value_residual = config.use_value_residual
        self._gate_input: torch.Tensor | None = None
        self._values = FirstValues()
        self.reset_parameters(config)

    @torch.no_grad()
    def reset_parameters(self, config: PreProjConfig) -> None:
        if self.preproj is not None:
            nn.init.normal_(self.preproj.up.weight, std=config.preproj_init_std)
            nn.init.normal_(self.preproj.down.weight, std=config.preproj_init_std)
        if self.skip is not None:
            nn.init.normal_(self.skip.weight, std=config.skip_init_std)
        if self.attn_gate is not None:
            nn.init.normal_(self.attn_gate.weight, std=config.gate_init_std)
        if self.value_mix is not None:
            self.value_mix.fill_(config.value_residual_init)
        if self.pre_mlp is not None:
            nn.init.normal_(self.pre_mlp.up.weight, std=config.preproj_init_std)
            nn.init.normal_(self.pre_mlp.down.weight, std=config.preproj_init_std)

    def around(self, base_layer: nn.Module, args: tuple, kwargs: dict) -> tuple[object, torch.Tensor | None]:
        """base_layer's output on x̃, and the skip term W_skip · x̃ (None without a skip)."""
        if "hidden_states" in kwargs:
            x_hat = kwargs["hidden_states"]
        elif args:
            x_hat = args[0]
        else:
            raise TypeError(f"{type(base_layer).__name__} was called without hidden_states.")
        x_tilde = self.preproj(x_hat) if self.preproj is not None else x_hat
        if "hidden_states" in kwargs:
            kwargs = {**kwargs, "hidden_states": x_tilde}
        else:
            args = (x_tilde, *args[1:])
        self._gate_input = x_hat if self.attn_gate is not None else None  # read by _gate_hook
        try:
            out = base_layer(*args, **kwargs)
        finally:
            self._gate_input = None
        if self.skip is None:
            return out, None
        attn_out = out[0] if isinstance(out, tuple) else out  # (B, T, d)
        return out, _as(F.linear(_as(x_tilde, self.skip.weight.dtype), self.skip.weight), attn_out.dtype)

    # --- the hooks of the block changes (installed by hook_into) ---

    def hook_into(self, layer: nn.Module, attention: nn.Module, output_proj: str | None, value_proj: str | None,
                  values: FirstValues) -> list:
        """Install the hooks the block changes need on this layer; returns their handles."""
        handles = []
        if self.attn_gate is not None:
            handles.append(projection(attention, output_proj, "gated attention", "output").register_forward_pre_hook(
                self._gate_hook))
        if self.value_residual:
            self._values = values
            handles.append(projection(attention, value_proj, "the value residual", "value").register_forward_hook(
                self._value_hook))
        if self.pre_mlp is not None:
            handles.append(layer.register_forward_pre_hook(self._pre_mlp_hook, with_kwargs=True))
        return handles

    def _gate_hook(self, module: nn.Module, args: tuple):
        """The output projection's input y (B, T, heads x head_dim) times σ(x̂ W_g), per channel or per head."""
        y, weight = args[0], self.attn_gate.weight
        gate = torch.sigmoid(F.linear(_as(self._gate_input, weight.dtype), weight))
        if gate.shape[-1] != y.shape[-1]:  # one gate per head
            gated = (y.unflatten(-1, (gate.shape[-1], -1)) * gate.unsqueeze(-1)).flatten(-2)
        else:
            gated = y * gate
        return (_as(gated, y.dtype), *args[1:])

    def _value_hook(self, module: nn.Module, args: tuple, values: torch.Tensor):
        if self.value_mix is None:  # the first layer: its values are what the later layers mix in
            self._values.tensor = values
            return None
        mix = self.value_mix
        return _as(mix[0] * self._values.tensor + mix[1] * values, values.dtype)

    def _pre_mlp_hook(self, layer: nn.Module, args: tuple, kwargs: dict):
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": self.pre_mlp(kwargs["hidden_states"])}
        return (self.pre_mlp(args[0]), *args[1:]), kwargs


def projection(attention: nn.Module, name: str | None, change: str, what: str) -> nn.Linear:
    """The attention's projection `name`, or a clear error naming the block change that needs it."""
    module = getattr(attention, name, None) if name else None
    if not isinstance(module, nn.Linear):
        raise ValueError(f"{change} needs the attention's {what} projection as its own nn.Linear; "
                         f"{type(attention).__name__} has none the family table names (a fused projection?).")
    return module


def add_to_output(out, term: torch.Tensor):
    """An attention module's output (a tensor, or a tuple led by one) with `term` added to its tensor."""
    if isinstance(out, tuple):
        return (out[0] + term, *out[1:])
    return out + term


class SkipRouting:
    """Where an attention wrapper sends its skip term: into the attention output, or, in blocks that norm the
    attention output before the residual add (Gemma-2/3, OLMo-2; `defer_skip`), to the SkipAfterNorm around
    that norm."""

    defer_skip: bool = False
    _deferred: torch.Tensor | None = None

    def route(self, out, skip: torch.Tensor | None):
        if skip is None:
            return out
        if self.defer_skip:
            self._deferred = skip
            return out
        return add_to_output(out, skip)

    def take_skip(self) -> torch.Tensor | None:
        skip, self._deferred = self._deferred, None
        return skip


class PreProjAttention(PreProjAdapter, SkipRouting):
    """Wraps a model's attention module; the original stays intact as `base_layer`."""

    def __init__(self, base_layer: nn.Module, d: int, config: PreProjConfig, device=None, defer_skip: bool = False,
                 **block):
        """`block`: attention_width, heads, first_layer and norm_eps, which the block changes need."""
        super().__init__(d, config, device=device, **block)
        self.base_layer = base_layer
        self.defer_skip = defer_skip
        self._hooks: list = []

    def forward(self, *args, **kwargs):
        return self.route(*self.around(self.base_layer, args, kwargs))


class SkipAfterNorm(nn.Module):
    """Wraps the norm a block applies to its attention output and adds the content skip after it:
    x + Norm(attn(x̃)) + W_skip · x̃, the paper's out = x + attention branch + W_skip · x̃. The original
    norm stays intact as `base_layer`."""

    def __init__(self, base_layer: nn.Module, attention: SkipRouting):
        super().__init__()
        self.base_layer = base_layer
        self._attention = [attention]  # a plain reference: the attention wrapper is registered in its own layer

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        out = self.base_layer(hidden_states, *args, **kwargs)
        skip = self._attention[0].take_skip()
        return out if skip is None else out + skip
