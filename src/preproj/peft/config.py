"""PreProjPeftConfig: PreProjConfig as a PEFT config, so that get_peft_model and PeftModel take it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from peft import PeftConfig

from ..core.adapter import PEFT_TYPE, config_from_metadata
from ..core.config import PreProjConfig


@dataclass
class PreProjPeftConfig(PreProjConfig, PeftConfig):
    """Every PreProjConfig field, plus PEFT's own (task_type, base_model_name_or_path, ...) and what the adapter
    records about its model. Saved, it is the same adapter_config.json that preproj.save_adapter writes."""

    model_type: str | None = field(
        default=None,
        metadata={"help": "model_type of the model the adapter was made on; filled in by get_peft_model."},
    )
    family: str | None = field(default=None, metadata={"help": "Its row of preproj's family table; checked on load."})
    hidden_size: int | None = field(default=None, metadata={"help": "Its width d; checked on load."})
    num_hidden_layers: int | None = field(
        default=None, metadata={"help": "Its number of decoder layers; checked on load."}
    )
    preproj_version: str | None = field(default=None, metadata={"help": "Version of preproj that made the adapter."})

    def __post_init__(self) -> None:
        PreProjConfig.__post_init__(self)
        if not self.is_paper_mode:
            raise ValueError(f"The PEFT integration carries the paper's modules (mode preproj, skip or preproj+skip), "
                             f"not {self.mode!r}: attach the block changes with preproj.attach instead.")
        PeftConfig.__post_init__(self)
        self.peft_type = PEFT_TYPE
        if self.task_type is None:
            self.task_type = "CAUSAL_LM"
        # Not a field, so never saved: the exact module names of this model that the tuner wraps, set when the
        # adapter is injected (PEFT's injection loop reads target_modules).
        self.target_modules = None

    def preproj_config(self) -> PreProjConfig:
        """The plain PreProjConfig inside, as preproj.attach takes it."""
        return PreProjConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PreProjConfig)})

    @classmethod
    def from_preproj_config(cls, config: PreProjConfig, **peft_fields) -> "PreProjPeftConfig":
        return cls(**config.to_dict(), **peft_fields)

    @classmethod
    def check_kwargs(cls, **kwargs):
        # adapter_config.json files written before the PEFT integration nest PreProjConfig under "config".
        if isinstance(kwargs.get("config"), dict):
            kwargs = {k: v for k, v in kwargs.items() if k != "config"} | config_from_metadata(kwargs).to_dict()
        return super().check_kwargs(**kwargs)
