"""The two modules of PAPER.md §1 (`PreProjAdapter` holds one adapter's pair) and the wrappers that put
them around an attention layer: `PreProjAttention` here, `preproj.peft.layer` for PEFT.

    x̂  = Norm(x)                                 the block's own attention-input norm
    x̃  = x̂ + W_down · act(W_up · x̂)             pre-projection, before Q/K/V (and before RoPE)
    out = x + attn(x̃) + W_skip · x̃              content skip, added to the attention output

Adding the skip term to the attention module's output is exact for sequential blocks
(x + attn_out) and for parallel-residual blocks (x + attn_out + mlp_out) alike.
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


class PreProjAdapter(nn.Module):
    """One adapter's modules for one attention layer: the pre-projection and/or the content skip.

    `around` runs a base attention module with them. The wrapper never depends on the attention's
    signature: it takes `hidden_states` (the keyword, else the first positional argument), replaces it
    by x̃ and passes everything else through untouched. K and V are computed by the base layer from x̃
    with the base shapes, so the K/V cache is exactly the base model's.
    """

    def __init__(self, d: int, config: PreProjConfig, device=None):
        super().__init__()
        dtype = config.torch_dtype
        self.preproj = (
            PreProjection(d, config.hidden_width(d), config.activation, dtype=dtype, device=device)
            if config.use_preproj
            else None
        )
        self.skip = nn.Linear(d, d, bias=False, dtype=dtype, device=device) if config.use_skip else None  # (d, d)
        self.reset_parameters(config)

    @torch.no_grad()
    def reset_parameters(self, config: PreProjConfig) -> None:
        if self.preproj is not None:
            nn.init.normal_(self.preproj.up.weight, std=config.preproj_init_std)
            nn.init.normal_(self.preproj.down.weight, std=config.preproj_init_std)
        if self.skip is not None:
            nn.init.normal_(self.skip.weight, std=config.skip_init_std)

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
        out = base_layer(*args, **kwargs)
        if self.skip is None:
            return out, None
        attn_out = out[0] if isinstance(out, tuple) else out  # (B, T, d)
        return out, _as(F.linear(_as(x_tilde, self.skip.weight.dtype), self.skip.weight), attn_out.dtype)


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

    def __init__(self, base_layer: nn.Module, d: int, config: PreProjConfig, device=None, defer_skip: bool = False):
        super().__init__(d, config, device=device)
        self.base_layer = base_layer
        self.defer_skip = defer_skip

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
