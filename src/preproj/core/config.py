"""PreProjConfig: what to attach, where, and how to initialise it (PEFT-style dataclass)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import torch

MODES = ("preproj", "skip", "preproj+skip")
ACTIVATIONS = ("silu", "gelu", "relu")
ADAPTER_DTYPES = ("float32", "bfloat16", "float16")


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class PreProjConfig:
    """Configuration of the pre-projection and content-skip adapter (PAPER.md §1)."""

    mode: str = field(
        default="preproj+skip",
        metadata={"help": "Which modules to add: 'preproj', 'skip' (content skip from the normed input, no pre-projection) or 'preproj+skip'."},
    )
    expansion: float = field(
        default=1.25, metadata={"help": "Hidden width of the pre-projection MLP as a multiple of d: floor(expansion * d)."}
    )
    activation: str = field(default="silu", metadata={"help": "Nonlinearity of the pre-projection: 'silu', 'gelu' or 'relu'."})
    preproj_init_std: float = field(default=0.01, metadata={"help": "Std of the normal init of W_up and W_down."})
    skip_init_std: float = field(default=1e-4, metadata={"help": "Std of the normal init of W_skip."})
    layers: list[int] | None = field(
        default=None, metadata={"help": "Indices of the decoder layers to adapt; None adapts every layer."}
    )
    structure: dict | None = field(
        default=None,
        metadata={"help": "For a decoder not in the family table: {'layers': dotted path to the ModuleList of decoder "
                          "layers, 'attention': the layer's attention attribute, 'input_norm': the layer's "
                          "attention-input norm attribute, or None where attention reads the layer's input}. attach "
                          "checks on one forward pass that the attention receives exactly that input."},
    )
    adapter_dtype: str = field(
        default="float32",
        metadata={"help": "Dtype of the adapter weights, kept in float32 by default even on a bf16 base (master weights)."},
    )

    def __post_init__(self) -> None:
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise ValueError(f"PreProjConfig.mode must be one of {MODES}, got {self.mode!r}.")
        if not isinstance(self.activation, str) or self.activation not in ACTIVATIONS:
            raise ValueError(f"PreProjConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}.")
        if isinstance(self.adapter_dtype, torch.dtype):
            self.adapter_dtype = str(self.adapter_dtype).removeprefix("torch.")
        if not isinstance(self.adapter_dtype, str) or self.adapter_dtype not in ADAPTER_DTYPES:
            raise ValueError(f"PreProjConfig.adapter_dtype must be one of {ADAPTER_DTYPES}, got {self.adapter_dtype!r}.")
        if not _finite_number(self.expansion) or not self.expansion > 0:
            raise ValueError(f"PreProjConfig.expansion must be a positive number, got {self.expansion!r}.")
        for name in ("preproj_init_std", "skip_init_std"):
            value = getattr(self, name)
            if not _finite_number(value) or value < 0:
                raise ValueError(f"PreProjConfig.{name} must be a non-negative number, got {value!r}.")
        if self.structure is not None:
            keys = {"layers", "attention", "input_norm"}
            if (not isinstance(self.structure, dict) or not {"layers", "attention"} <= set(self.structure) <= keys
                    or not all(isinstance(self.structure[k], str) for k in ("layers", "attention"))
                    or not isinstance(self.structure.get("input_norm"), (str, type(None)))):
                raise ValueError("PreProjConfig.structure must be a dict with 'layers' and 'attention' (strings) and "
                                 f"'input_norm' (a string or None), got {self.structure!r}.")
        if self.layers is not None:
            if not isinstance(self.layers, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in self.layers):
                raise ValueError(f"PreProjConfig.layers must be a list of layer indices, got {self.layers!r}.")
            self.layers = sorted(set(self.layers))

    @property
    def use_preproj(self) -> bool:
        return self.mode in ("preproj", "preproj+skip")

    @property
    def use_skip(self) -> bool:
        return self.mode in ("skip", "preproj+skip")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.adapter_dtype)

    def hidden_width(self, d: int) -> int:
        # int() of the float product floors it, as the paper's int(1.25 * d) does.
        return int(self.expansion * d)

    def params_per_layer(self, d: int) -> int:
        return (2 * d * self.hidden_width(d) if self.use_preproj else 0) + (d * d if self.use_skip else 0)

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
