"""The model card (README.md) of an export: what the model is, how to load it, how it was trained and scored, and
whose terms apply."""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import nn

from ..core.attach import adapter_state_dict
from ..runtime.loading import EMBEDDED

METHOD_TEXT = {
    "preproj": "a pre-projection x̃ = x̂ + W_down · act(W_up · x̂) before the attention's Q, K and V",
    "skip": "a content skip W_skip · x̂ from the attention's normed input, added to the attention output",
    "preproj+skip": "a pre-projection x̃ = x̂ + W_down · act(W_up · x̂) before the attention's Q, K and V, and a "
                    "content skip W_skip · x̃ added to the attention output",
}
CHANGE_TEXT = {
    "gate": "gated attention (the attention output times σ(x̂ W_g), one gate per channel)",
    "gate-head": "gated attention (one gate σ(x̂ W_g) per head)",
    "value-residual": "a value residual (each layer's values mixed with the first layer's, V' = λ₁V₁ + λ₂V)",
    "pre-mlp": "a pre-attention MLP x + ½ W_down · act(W_up · RMSNorm(x))",
}


def method_text(mode: str) -> str:
    """The paper's modules as they are described, then each block change."""
    parts = mode.split("+")
    paper = "+".join(p for p in parts if p in ("preproj", "skip"))
    return ", and ".join(([METHOD_TEXT[paper]] if paper else []) + [CHANGE_TEXT[p] for p in parts if p in CHANGE_TEXT])


def model_card(base: nn.Module, config: dict, run_dir: str | os.PathLike | None) -> str:
    name = getattr(base.config, "_name_or_path", None) or config.get("model_type")
    embedded = EMBEDDED.get(name)
    hub_id = embedded.hub_id if embedded else (name if name and not Path(name).exists() else None)
    name = hub_id or Path(name).name
    from_scratch = bool(_read(Path(run_dir) / "train_config.json").get("train_base")) if run_dir else False
    spec = config["preproj"]
    added = sum(t.numel() for t in adapter_state_dict(base).values())
    total = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
    front = ["---", "library_name: transformers", "pipeline_tag: text-generation", "tags:", "- preproj",
             f"license: {embedded.licence if embedded else 'other'}"] + ([f"base_model: {hub_id}"] if hub_id else [])
    what = f"A {type(base).__name__} trained from scratch" if from_scratch else name
    lines = front + ["---", "", f"# {name} with preproj ({spec['mode']})", "",
                     f"{what} with {method_text(spec['mode'])}, in {len(spec['adapted_layers'])} attention "
                     f"layers: {added:,} parameters added to the base's {total - added:,}. The modules are nonlinear, "
                     "so they cannot be merged into the base weights; this directory carries them with "
                     "`modeling_preproj.py`, which builds the base's own transformers class "
                     f"(`{type(base).__name__}`), and `preproj_modules.py`, which wraps its attention.", "",
                     "## Use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                     'model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)',
                     'tokenizer = AutoTokenizer.from_pretrained("PATH", trust_remote_code=True)', "```", "",
                     "`trust_remote_code=True` runs the two Python files in this directory: they import torch and "
                     "transformers only and are short enough to read before you run them. The tokenizer asks for it "
                     "too, as transformers reads the model's config (`PreProjConfig`, in `modeling_preproj.py`) to "
                     "find it.", ""]
    lines += _training(run_dir) + _evaluation(run_dir)
    note = (embedded.licence_note if embedded else "Trained from scratch: its licence is whoever shares it to choose."
            if from_scratch else f"The licence of the base model ({name}) applies.")
    lines += ["## Licence", "", f"{note} Exported with preproj, which is MIT-licensed.", ""]
    return "\n".join(lines)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _training(run_dir, inputs: str = "sequences x length") -> list[str]:
    if run_dir is None or not (Path(run_dir) / "train_config.json").is_file():
        return []
    args, summary = _read(Path(run_dir) / "train_config.json"), _read(Path(run_dir) / "summary.json")
    heldout = summary.get("final_heldout_loss")
    rows = [("method", args.get("method")), ("data", args.get("data_description") or args.get("data")),
            ("steps", args.get("steps")), ("tokens seen", summary.get("tokens_seen")),
            ("learning rate", args.get("lr")), (inputs, f"{args.get('global_batch_size')} x {args.get('seq_len')}"),
            ("precision", args.get("precision")), ("seed", args.get("seed")),
            ("final held-out loss", f"{heldout:.4f}" if isinstance(heldout, float) else None)]
    how = ("Trained from scratch with `preproj pretrain`, every weight learning." if args.get("train_base") else
           "Trained with `preproj train`: the base frozen, only the added modules learning.")
    return ["## Training", "", how,
            "", "| setting | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows if v is not None] + [""]


def _evaluation(run_dir) -> list[str]:
    files = sorted(Path(run_dir).glob("eval.*.json")) if run_dir is not None else []
    rows = []
    scratch = _read(Path(run_dir) / "summary.json") if run_dir is not None else {}
    for split, loss in scratch.get("loss", {}).items():  # a pretrain run's own scores of whole texts
        tokens = scratch.get("scored_tokens", {}).get(split, "")
        rows.append(f"| {split} text | loss (nats/token) | {loss:.4f} | {tokens} tokens | all windows |")
    for path in files:
        record = _read(path)
        result, setting = record.get("result", {}), record.get("setting", {})
        for metric, value in result.items():
            if metric in ("n",) or metric.endswith("_stderr") or not isinstance(value, (int, float)):
                continue
            stderr = result.get(f"{metric}_stderr")
            shown = f"{value:.4f}" + (f" ± {stderr:.4f}" if isinstance(stderr, (int, float)) else "")
            rows.append(f"| {path.stem.removeprefix('eval.')} | {metric} | {shown} | {result.get('n', '')} | "
                        f"{setting.get('protocol', '')} |")
    if not rows:
        return []
    return ["## Evaluation", "", "The scores recorded in the run's directory (± one standard error over items where "
            "given).", "",
            "| task | metric | value | items | protocol |", "|---|---|---|---|---|"] + rows + [""]


VISION_TASKS = {"image": ("image-classification", "images (batch, channels, size, size)", "class logits"),
                "direction": ("video-classification", "whole clips (batch, frames, channels, size, size)",
                              "class logits (which way the first digit moves)"),
                "next-frame": (None, "the context's frames (batch, context, channels, size, size)",
                               "the following frames' pixel logits (batch, frames - context, channels, size, size)")}


def vision_card(base: nn.Module, config: dict, run_dir: str | os.PathLike | None) -> str:
    """The card of a vision run trained from scratch: what it takes and gives, its training and its scores."""
    shape, spec = config["vision"], config["preproj"]
    pipeline, takes, gives = VISION_TASKS[shape.get("objective") or shape["kind"]]
    added = sum(t.numel() for t in adapter_state_dict(base).values())
    total = sum(p.numel() for p in base.parameters())
    position = ("axial RoPE inside attention, so the modules see no position" if shape["position"] == "rope" else
                "a learned embedding added before the blocks, which the modules read")
    front = ["---", "library_name: transformers"] + ([f"pipeline_tag: {pipeline}"] if pipeline else []) + [
        "tags:", "- preproj", "- vision", "license: other", "---", ""]
    lines = front + [f"# {type(base).__name__} with preproj ({spec['mode']})", "",
                     f"A vision transformer trained from scratch with {method_text(spec['mode'])}, in "
                     f"{len(spec['adapted_layers'])} attention layers ({added:,} of its {total:,} parameters). Its "
                     f"body is transformers' Pixtral vision encoder, position entering as {position}. "
                     "`modeling_preproj_vision.py` builds it and `preproj_modules.py` wraps its attention.", "",
                     "## Use", "", "```python", "from transformers import AutoModel", "",
                     'model = AutoModel.from_pretrained("PATH", trust_remote_code=True)',
                     "logits = model(pixel_values).logits", "```", "",
                     f"It takes {takes} as a tensor, floats or uint8 read as value / 255 (the directory holds no "
                     f"image processor), and gives {gives}. "
                     "`trust_remote_code=True` runs the two Python files in this directory: they import torch and "
                     "transformers only and are short enough to read before you run them.", ""]
    lines += _training(run_dir, "inputs x tokens") + _vision_scores(run_dir)
    return "\n".join(lines + ["## Licence", "", "Trained from scratch: its licence is whoever shares it to choose. "
                              "Exported with preproj, which is MIT-licensed.", ""])


def _vision_scores(run_dir) -> list[str]:
    summary = _read(Path(run_dir) / "summary.json") if run_dir is not None else {}
    rows = [f"| {split} | {metric} | {value:.4f} |" for metric in ("loss", "accuracy")
            for split, value in summary.get(metric, {}).items() if isinstance(value, (int, float))]
    if not rows:
        return []
    return ["## Evaluation", "", "The run's own scores (`test_shuffled`: the test inputs with their patches permuted "
            "and their positions kept).", "", "| split | metric | value |", "|---|---|---|"] + rows + [""]
