"""Save and load adapters as PEFT does: adapter_config.json + adapter_model.safetensors.

Only adapter tensors are written; nothing executable is ever read back (no pickle).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..runtime.files import atomic_write, write_json
from ..runtime.provenance import preproj_version
from .attach import adapter_state_dict, attach, detach
from .config import PreProjConfig
from .families import decoder_layers, family_of, hidden_size

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PEFT_TYPE = "PREPROJ"


class AdapterError(ValueError):
    """An adapter directory that cannot be loaded onto the given model."""


def adapter_metadata(model: nn.Module, config: PreProjConfig | None = None) -> dict:
    """What an adapter file records about the model it was made on; load checks it against the model."""
    family = family_of(model, config)
    return {
        "base_model_name_or_path": getattr(model.config, "_name_or_path", None) or None,
        "model_type": model.config.model_type,
        "family": family.name,
        "hidden_size": hidden_size(model),
        "num_hidden_layers": len(decoder_layers(model, family)),
        "preproj_version": preproj_version(),
    }


def config_from_metadata(meta: dict) -> PreProjConfig:
    """The PreProjConfig in an adapter_config.json: its fields at top level, as PEFT writes them, or (files
    written before preproj 0.1's PEFT integration) nested under "config"."""
    if isinstance(meta.get("config"), dict):
        return PreProjConfig.from_dict(meta["config"])
    names = {f.name for f in dataclasses.fields(PreProjConfig)}
    return PreProjConfig.from_dict({k: v for k, v in meta.items() if k in names})


def save_adapter(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write the adapter of `model` (tensors only) and its config to `directory`."""
    config = getattr(model, "preproj_config", None)
    if config is None:
        raise AdapterError("The model carries no preproj adapter; attach one with preproj.attach(model, config).")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in adapter_state_dict(model).items()}
    atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    # The same keys PEFT writes for preproj.peft.PreProjPeftConfig, so PEFT and preproj read each other's files.
    meta = {"peft_type": PEFT_TYPE, "task_type": "CAUSAL_LM", "inference_mode": True, **adapter_metadata(model, config),
            **config.to_dict()}
    write_json(directory / CONFIG_NAME, meta)
    return directory


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise AdapterError(f"No {CONFIG_NAME} in {path.parent}: is this a directory written by preproj.save_adapter?")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"{path} is not valid JSON ({e}); the file is truncated or corrupt.") from None
    if not isinstance(meta, dict):
        raise AdapterError(f"{path} is not an adapter config (a JSON object).")
    return meta


def read_adapter_config(directory: str | os.PathLike) -> dict:
    path = Path(directory) / CONFIG_NAME
    meta = _read_json(path)
    if meta.get("peft_type") != PEFT_TYPE:
        raise AdapterError(f"{path} is not a preproj adapter config (expected peft_type {PEFT_TYPE!r}, "
                           f"found {meta.get('peft_type')!r}).")
    return meta


def check_compatible(meta: dict, model: nn.Module, directory, config: PreProjConfig) -> None:
    """Refuse an adapter recorded on a model of another family, width or depth, naming what differs."""
    try:
        have = adapter_metadata(model, config)
    except ValueError as e:  # a model of a family the adapter cannot be rebuilt on
        raise AdapterError(f"Adapter in {directory} does not fit this model: {e}") from None

    def described(record: dict, key: str) -> str:
        # a family row serves several model types (gemma2 builds Gemma 3 too): the model's own type is named with it
        if key == "family" and record.get("model_type") and record["model_type"] != record.get("family"):
            return f"{record['model_type']!r} (family {record.get('family')!r})"
        return repr(record.get(key))

    for key, what in (("family", "model family"), ("hidden_size", "hidden size"), ("num_hidden_layers", "layer count")):
        if meta.get(key) != have[key]:
            raise AdapterError(
                f"Adapter in {directory} does not fit this model: {what} mismatch "
                f"(adapter: {described(meta, key)}, model: {described(have, key)}). "
                f"It was trained on {meta.get('base_model_name_or_path') or meta.get('model_type')!r}."
            )


def load_adapter(model: nn.Module, directory: str | os.PathLike, dtype: torch.dtype | None = None) -> nn.Module:
    """Rebuild the adapter saved in `directory` on `model` and load its weights.

    A preproj adapter is attached in place and `model` is returned. The LoRA baselines written by
    `preproj train` load through PEFT (safetensors only) and return the PeftModel: a PEFT LoRA
    directory, or a preproj directory with the LoRA half in `lora/` (method preproj+lora).
    `dtype` casts the adapter's weights (default: the dtype they were saved in).
    """
    directory = Path(directory)
    if _read_json(directory / CONFIG_NAME).get("peft_type") == "LORA":
        model = _load_lora(model, directory, dtype)
        model.preproj_adapter_dir = str(directory)
        return model
    meta = read_adapter_config(directory)
    try:
        config = config_from_metadata(meta)
        if dtype is not None:
            config = PreProjConfig.from_dict({**config.to_dict(), "adapter_dtype": str(dtype).removeprefix("torch.")})
    except (TypeError, ValueError) as e:
        raise AdapterError(f"Invalid adapter config in {directory / CONFIG_NAME}: {e}") from None
    check_compatible(meta, model, directory, config)

    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        raise AdapterError(f"No {WEIGHTS_NAME} in {directory}; preproj only reads safetensors, never pickles.")
    try:
        tensors = load_file(weights)
    except (SafetensorError, OSError, ValueError) as e:
        raise AdapterError(f"{weights} could not be read ({e}); the file is truncated or corrupt.") from None

    attach(model, config)
    expected = adapter_state_dict(model)
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    bad_shape = [k for k in expected if k in tensors and tensors[k].shape != expected[k].shape]
    if missing or unexpected or bad_shape:
        detach(model)
        parts = [f"{what} {keys[:4]}" for what, keys in (("missing", missing), ("unexpected", unexpected),
                                                           ("wrong shape", bad_shape)) if keys]
        raise AdapterError(f"{weights} does not match its config: {', '.join(parts)}.")
    with torch.no_grad():
        for key, param in expected.items():
            param.copy_(tensors[key])
    if (directory / "lora" / CONFIG_NAME).is_file():
        model = _load_lora(model, directory / "lora", dtype)
    model.preproj_adapter_dir = str(directory)
    return model


def describe_adapter(model: nn.Module) -> str | None:
    """The adapter a model carries, for a results file: the directory load_adapter read it from, else what is
    attached in memory, else None."""
    loaded = getattr(model, "preproj_adapter_dir", None)
    if loaded:
        return loaded
    config = getattr(model, "preproj_config", None)
    peft = getattr(model, "peft_config", None)
    attached = ([config.mode] if config is not None else []) + [
        str(getattr(c, "peft_type", "peft")).rpartition(".")[2].lower() for c in (peft or {}).values()]
    return f"{' + '.join(attached)} (attached in memory)" if attached else None


def _load_lora(model: nn.Module, directory: Path, dtype: torch.dtype | None = None):
    from peft import PeftModel

    if not (directory / WEIGHTS_NAME).is_file():
        raise AdapterError(f"No {WEIGHTS_NAME} in {directory}; preproj only reads safetensors, never pickles.")
    try:
        peft_model = PeftModel.from_pretrained(model, directory, autocast_adapter_dtype=dtype is None)
    except (ValueError, RuntimeError, OSError, KeyError) as e:
        raise AdapterError(f"The LoRA adapter in {directory} does not fit this model: {e}") from None
    if dtype is not None:
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.data = param.data.to(dtype)
    return peft_model
