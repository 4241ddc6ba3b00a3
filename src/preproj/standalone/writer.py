"""Write an adapted model as an ordinary transformers model directory that loads without preproj.

The pre-projection and the skip are nonlinear and cannot be merged into the base weights, so the directory carries
a small modeling file (modeling_preproj.py, beside this module) that builds the base architecture's own transformers
class and wraps its attention as `attach` does (with preproj_modules.py, which it imports); config.json maps
AutoConfig and AutoModelForCausalLM to it, and `from_pretrained(path, trust_remote_code=True)` loads it. A LoRA half
(method preproj+lora) is merged into the base weights first: it is linear, so merging is exact up to rounding.

A vision run (preproj.vision's models, trained by `pretrain --task mnist|moving-mnist...`) carries
modeling_preproj_vision.py instead, which builds its Pixtral encoder, head and positions; config.json maps AutoModel
to it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..core.attach import adapted_layers, is_attached
from ..core.families import family_of
from ..runtime.files import give_plain_modes, write_json
from .card import model_card, vision_card

MODELING_FILE = "modeling_preproj.py"
VISION_MODELING_FILE = "modeling_preproj_vision.py"
MODULES_FILE = "preproj_modules.py"  # the modules and the attention wrapper, which both modeling files import
VISION_HEADS = {"image": "AutoModelForImageClassification", "direction": "AutoModelForVideoClassification"}
"""The auto class of each vision task beside AutoModel (next-frame prediction has none)."""
WEIGHTS_FILE = "model.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ExportError(ValueError):
    """A model or an output directory that export cannot use, with what to do about it."""


def export(model: nn.Module, out: str | os.PathLike, tokenizer=None, *, dtype: str | torch.dtype | None = None,
           run_dir: str | os.PathLike | None = None) -> Path:
    """Write `model` (a language model carrying a preproj adapter, optionally under a PEFT LoRA, or one of
    preproj.vision's models with the modules attached) to `out` as a transformers model directory: weights in
    safetensors, config.json with an auto_map to the modeling file (modeling_preproj.py, or
    modeling_preproj_vision.py) and preproj_modules.py beside it, the tokenizer when given, generation_config.json
    for a language model and a model card. `dtype` casts every weight (default: the base's dtype);
    `run_dir`, the training run's directory, lends the card its training settings and evaluation numbers.
    The directory appears whole or not at all."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} already exists and is not empty; export writes a new directory: choose another "
                          "--out or remove it.")
    base, state = _merged_state(model)
    vision = is_vision(base)
    target_dtype = _dtype(dtype, base)
    tensors = _dedup_tied({k: v.detach().to(target_dtype).contiguous().cpu() for k, v in state.items()})
    config = (_vision_config if vision else _config)(base, target_dtype)
    code = {VISION_MODELING_FILE: _source(VISION_MODELING_FILE)} if vision else {MODELING_FILE: modeling_source(base)}

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
    try:
        save_file(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        write_json(tmp / "config.json", config)
        for name, source in {**code, MODULES_FILE: _source(MODULES_FILE)}.items():
            (tmp / name).write_text(source)
        if getattr(base, "generation_config", None) is not None:
            base.generation_config.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text((vision_card if vision else model_card)(base, config, run_dir))
        give_plain_modes(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _merged_state(model: nn.Module) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """(the preproj-attached base, its state dict with any LoRA merged in), leaving `model` untouched."""
    lora = hasattr(model, "get_base_model") and hasattr(model, "peft_config")
    base = model.get_base_model() if lora else model
    if not is_attached(base):
        advice = (" For a LoRA adapter alone, PEFT's merge_and_unload() and save_pretrained() already give an ordinary "
                  "model." if lora else "")
        raise ExportError(f"{type(base).__name__} carries no preproj adapter, so there is nothing to export: attach "
                          f"one (preproj.attach) or load one (preproj.load_adapter) first.{advice}")
    state = dict(base.state_dict())
    if lora:
        state = _merge_lora(base, state)
    return base, state


def _merge_lora(base: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from peft.tuners.lora import LoraLayer

    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        with torch.no_grad():
            weight = module.get_base_layer().weight
            for adapter in module.active_adapters:
                weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
        state[f"{name}.weight"] = weight
        if f"{name}.base_layer.bias" in state:
            state[f"{name}.bias"] = state[f"{name}.base_layer.bias"]
    lora_modules = tuple(f"{n}." for n, m in base.named_modules() if isinstance(m, LoraLayer))
    return {k: v for k, v in state.items() if _keeps(k, lora_modules)}


def _keeps(key: str, lora_modules: tuple[str, ...]) -> bool:
    """Inside a LoRA-wrapped module keep only the merged weight and bias; drop lora_* and the base_layer copies."""
    prefix = next((p for p in lora_modules if key.startswith(p)), None)
    return prefix is None or key[len(prefix):] in ("weight", "bias")


def is_vision(base: nn.Module) -> bool:
    """One of preproj.vision's models (which this layer does not import): they name their own model_type."""
    return str(getattr(base, "model_type", "")).startswith("preproj-") and hasattr(base, "shape")


def _dtype(dtype: str | torch.dtype | None, base: nn.Module) -> torch.dtype:
    if dtype is None:
        return next(base.parameters()).dtype if is_vision(base) else base.get_input_embeddings().weight.dtype
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ExportError(f"Unknown export dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    return DTYPES[dtype]


def _dedup_tied(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses two names for one storage (a head tied to the embeddings); keep the first name, as
    save_pretrained does: from_pretrained ties the other back from the config."""
    seen, kept = set(), {}
    for key, tensor in tensors.items():
        pointer = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if pointer not in seen:
            seen.add(pointer)
            kept[key] = tensor
    return kept


def _config(base: nn.Module, dtype: torch.dtype) -> dict:
    values = base.config.to_dict()
    values.update({
        "model_type": f"preproj_{base.config.model_type}",
        "architectures": ["PreProjForCausalLM"],
        "auto_map": {"AutoConfig": "modeling_preproj.PreProjConfig",
                     "AutoModelForCausalLM": "modeling_preproj.PreProjForCausalLM"},
        "dtype": str(dtype).removeprefix("torch."),
        "preproj": _modules_spec(base),
    })
    return values


def _vision_config(base: nn.Module, dtype: torch.dtype) -> dict:
    """config.json of a vision run: its shape (`vision`, with `kind`), its encoder's Pixtral config and the modules."""
    module = VISION_MODELING_FILE.removesuffix(".py")
    kind = "image" if base.model_type == "preproj-image-classifier" else "clip"
    task = getattr(base.shape, "objective", None) or kind  # image, next-frame or direction
    auto_map = {"AutoConfig": f"{module}.PreProjVisionConfig", "AutoModel": f"{module}.PreProjVisionModel"}
    if task in VISION_HEADS:
        auto_map[VISION_HEADS[task]] = auto_map["AutoModel"]
    classes = {} if task == "next-frame" else {
        "id2label": {str(i): str(i) for i in range(base.shape.classes)},
        "label2id": {str(i): i for i in range(base.shape.classes)}}
    return {"model_type": "preproj_vision", "architectures": ["PreProjVisionModel"], "auto_map": auto_map,
            "dtype": str(dtype).removeprefix("torch."), "vision": {"kind": kind, **asdict(base.shape)},
            "pixtral": base.config.to_dict(), "preproj": _modules_spec(base), **classes}


def _modules_spec(base: nn.Module) -> dict:
    """config.json's `preproj`: the mode, the modules' sizes, which layers and where they live."""
    family = family_of(base)
    config = base.preproj_config
    d = int(base.config.hidden_size)
    return {
        "mode": config.mode,
        "hidden_width": config.hidden_width(d),
        "activation": config.activation,
        "adapted_layers": [i for i, _ in adapted_layers(base)],
        "decoder_layers": family.layers,
        "attention": family.attention,
        "skip_after": family.skip_after if config.use_skip else None,
        **({} if config.is_paper_mode else _block_changes(base, family)),
    }


def _block_changes(base: nn.Module, family) -> dict:
    """What the modeling file needs for gated attention, the value residual and the pre-MLP: the projections' names
    and the sizes the wrappers were built with."""
    wrapper = adapted_layers(base)[0][1]
    return {"output_proj": family.output_proj, "value_proj": family.value_proj,
            "attention_width": wrapper.attn_gate.out_features if base.preproj_config.gate == "elementwise" else None,
            "heads": wrapper.attn_gate.out_features if base.preproj_config.gate == "head" else None,
            "norm_eps": wrapper.pre_mlp.norm.eps if wrapper.pre_mlp is not None else None}


def modeling_source(base: nn.Module) -> str:
    """modeling_preproj.py with its two base-class imports naming this model's transformers classes."""
    import transformers

    model_class, config_class = type(base), type(base.config)
    for cls in (model_class, config_class):
        if getattr(transformers, cls.__name__, None) is not cls:
            raise ExportError(f"{cls.__name__} is not a transformers class, so an export could not rebuild the base "
                              "with transformers alone; export supports models whose classes ship with transformers.")
    source = _source(MODELING_FILE)
    for alias, cls in (("BaseConfig", config_class), ("BaseForCausalLM", model_class)):
        source = re.sub(rf"import \w+ as {alias}\b", f"import {cls.__name__} as {alias}", source, count=1)
    return source


def _source(name: str) -> str:
    return Path(__file__).with_name(name).read_text()
