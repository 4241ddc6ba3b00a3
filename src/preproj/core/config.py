"""PreProjConfig: what to attach, where, and how to initialise it (PEFT-style dataclass)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import torch

MODES = ("preproj", "skip", "preproj+skip")
"""The paper's modes: what PEFT, export and the pretrained-model study carry."""
COMPONENTS = ("preproj", "skip", "gate", "gate-head", "value-residual", "pre-mlp")
"""What a mode joins with '+', in this order. The last four are the cheap block changes that from-scratch runs
compare the content skip with (docs/guide/variants.md): gated attention (elementwise or one gate per head), the
value residual and a pre-attention MLP."""
ACTIVATIONS = ("silu", "gelu", "relu")
ADAPTER_DTYPES = ("float32", "bfloat16", "float16")


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class PreProjConfig:
    """Configuration of the pre-projection and content-skip adapter (docs/method.md: the two modules)."""

    mode: str = field(
        default="preproj+skip",
        metadata={"help": "Which modules to add, joined by '+': 'preproj' (pre-projection), 'skip' (content skip), "
                          "'gate' or 'gate-head' (gated attention), 'value-residual', 'pre-mlp'; for example "
                          "'preproj+skip' (the paper's method) or 'preproj+skip+gate'."},
    )
    expansion: float = field(
        default=1.25,
        metadata={"help": "Hidden width of the pre-projection MLP as a multiple of d: floor(expansion * d)."},
    )
    activation: str = field(
        default="silu", metadata={"help": "Nonlinearity of the pre-projection: 'silu', 'gelu' or 'relu'."}
    )
    preproj_init_std: float = field(default=0.01, metadata={"help": "Std of the normal init of W_up and W_down."})
    skip_init_std: float = field(default=1e-4, metadata={"help": "Std of the normal init of W_skip."})
    gate_init_std: float = field(default=0.02, metadata={"help": "Std of the normal init of the attention gate's W_g."})
    value_residual_init: float = field(
        default=0.5, metadata={"help": "Initial value of both mixing weights λ₁ (first layer's values) and λ₂ (own)."}
    )
    layers: list[int] | None = field(
        default=None, metadata={"help": "Indices of the decoder layers to adapt; None adapts every layer."}
    )
    structure: dict | None = field(
        default=None,
        metadata={"help": "For a decoder not in the family table: {'layers': dotted path to the ModuleList of decoder "
                          "layers, 'attention': the layer's attention attribute, 'input_norm': the layer's "
                          "attention-input norm attribute, or None where attention reads the layer's input}. attach "
                          "checks on one forward pass that the attention receives exactly that input. Gated attention "
                          "and the value residual also need 'output_proj' and 'value_proj', the attention's "
                          "projections by attribute name."},
    )
    adapter_dtype: str = field(
        default="float32",
        metadata={"help": "Dtype of the adapter weights, kept in float32 by default even on a bf16 base "
                          "(master weights)."},
    )

    def __post_init__(self) -> None:
        self.mode = canonical_mode(self.mode)
        if not isinstance(self.activation, str) or self.activation not in ACTIVATIONS:
            raise ValueError(f"PreProjConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}.")
        if isinstance(self.adapter_dtype, torch.dtype):
            self.adapter_dtype = str(self.adapter_dtype).removeprefix("torch.")
        if not isinstance(self.adapter_dtype, str) or self.adapter_dtype not in ADAPTER_DTYPES:
            raise ValueError(f"PreProjConfig.adapter_dtype must be one of {ADAPTER_DTYPES}, "
                             f"got {self.adapter_dtype!r}.")
        if not _finite_number(self.expansion) or not self.expansion > 0:
            raise ValueError(f"PreProjConfig.expansion must be a positive number, got {self.expansion!r}.")
        if not _finite_number(self.value_residual_init):
            raise ValueError(f"PreProjConfig.value_residual_init must be a number, got {self.value_residual_init!r}.")
        for name in ("preproj_init_std", "skip_init_std", "gate_init_std"):
            value = getattr(self, name)
            if not _finite_number(value) or value < 0:
                raise ValueError(f"PreProjConfig.{name} must be a non-negative number, got {value!r}.")
        if self.structure is not None:
            optional = ("input_norm", "output_proj", "value_proj")
            if (not isinstance(self.structure, dict) or not {"layers", "attention"} <= set(self.structure)
                    or not set(self.structure) <= {"layers", "attention", *optional}
                    or not all(isinstance(self.structure[k], str) for k in ("layers", "attention"))
                    or not all(isinstance(self.structure.get(k), (str, type(None))) for k in optional)):
                raise ValueError("PreProjConfig.structure must be a dict with 'layers' and 'attention' (strings) and "
                                 "'input_norm' (a string or None; and, for gated attention or the value residual, "
                                 f"'output_proj' or 'value_proj'), got {self.structure!r}.")
        if self.layers is not None:
            if not isinstance(self.layers, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                     for i in self.layers):
                raise ValueError(f"PreProjConfig.layers must be a list of layer indices, got {self.layers!r}.")
            self.layers = sorted(set(self.layers))

    @property
    def components(self) -> tuple[str, ...]:
        return tuple(self.mode.split("+"))

    @property
    def use_preproj(self) -> bool:
        return "preproj" in self.components

    @property
    def use_skip(self) -> bool:
        return "skip" in self.components

    @property
    def gate(self) -> str | None:
        """'elementwise' (one gate per attention channel), 'head' (one per head) or None."""
        return "elementwise" if "gate" in self.components else "head" if "gate-head" in self.components else None

    @property
    def use_value_residual(self) -> bool:
        return "value-residual" in self.components

    @property
    def use_pre_mlp(self) -> bool:
        return "pre-mlp" in self.components

    @property
    def is_paper_mode(self) -> bool:
        """Only the paper's modules: what PEFT and export carry."""
        return self.mode in MODES

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.adapter_dtype)

    def hidden_width(self, d: int) -> int:
        # int() of the float product floors it, as the paper's int(1.25 * d) does.
        return int(self.expansion * d)

    def params_per_layer(self, d: int) -> int:
        """The pre-projection's and the skip's parameters in one layer (what LoRA's rank is matched to)."""
        return (2 * d * self.hidden_width(d) if self.use_preproj else 0) + (d * d if self.use_skip else 0)

    def matmul_params_per_layer(self, d: int, attention_width: int, heads: int) -> int:
        """Every added weight that a token's forward pass multiplies by (2 FLOPs each), in one layer; attention_width
        is the attention's output before its output projection (heads x head_dim)."""
        gate = {"elementwise": d * attention_width, "head": d * heads, None: 0}[self.gate]
        return self.params_per_layer(d) + gate + (2 * d * self.hidden_width(d) if self.use_pre_mlp else 0)

    def added_params(self, layers: int, d: int, attention_width: int, heads: int) -> int:
        """Every parameter the mode adds to a model of `layers` adapted layers: the matmul weights, the pre-MLP's
        norm and the value residual's two weights in every layer but the first (whose values it mixes in)."""
        return layers * (self.matmul_params_per_layer(d, attention_width, heads) + (d if self.use_pre_mlp else 0)) \
            + (2 * (layers - 1) if self.use_value_residual else 0)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "PreProjConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"Unknown PreProjConfig fields {unknown}; known fields are {sorted(names)}.")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "PreProjConfig":
        return cls.from_dict(json.loads(text))


def canonical_mode(mode) -> str:
    """The mode with its components in COMPONENTS' order; a clear error for an unknown or repeated one."""
    parts = mode.split("+") if isinstance(mode, str) else None
    if not parts or any(p not in COMPONENTS for p in parts) or len(set(parts)) != len(parts) \
            or {"gate", "gate-head"} <= set(parts):
        raise ValueError(f"PreProjConfig.mode must join some of {', '.join(COMPONENTS)} with '+' (each once, one "
                         f"kind of gate), for example 'preproj+skip'; got {mode!r}.")
    return "+".join(c for c in COMPONENTS if c in parts)
