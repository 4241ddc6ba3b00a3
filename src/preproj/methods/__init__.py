"""The methods compared: one registry entry each (methods.registry), the LoRA baselines through PEFT (methods.lora)."""

from .registry import (
    METHODS,
    Method,
    build_method,
    default_methods,
    method,
    paper_lora_rank,
    register_method,
    save_method,
    save_model_dir,
    trained_methods,
)

__all__ = ["METHODS", "Method", "build_method", "default_methods", "method", "paper_lora_rank", "register_method",
           "save_method", "save_model_dir", "trained_methods"]
