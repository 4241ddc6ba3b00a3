"""`preproj inspect`: where the modules sit, what they add, and what they cost at inference."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ..core.attach import adapted_layers, attach, trainable_parameters
from ..core.config import PreProjConfig, canonical_mode
from ..core.families import FAMILIES, decoder_layers, family_of, input_norm_of
from ..runtime.loading import count_parameters
from ..runtime.precision import precision as as_precision
from ..runtime.validation import check_args


@dataclass
class InspectArgs:
    """Arguments of `preproj inspect`."""

    model: str = "smollm2-135m"
    """Embedded name, Hugging Face hub id or local directory."""
    trust_remote_code: bool = False
    """Run the modeling code a model directory carries (a `preproj export` directory); without it such a model is
    refused, naming the files."""
    mode: str = "preproj+skip"
    """Adapter mode to inspect: preproj, skip or preproj+skip, or with block changes joined by '+' (gate,
    gate-head, value-residual, pre-mlp)."""
    context: int = 1024
    """Context length (tokens, batch 1) at which the K/V cache is measured."""
    prompt: str = "The capital of France is"
    """Prompt of the greedy samples."""
    new_tokens: int = 16
    """Tokens to generate per sample."""
    seed: int = 0
    """Seed of the adapter's (paper) initialisation."""
    precision: str = "fp32"
    """fp32, bf16-mixed, bf16-true or bf16-frozen: the dtype the base is loaded in and the forward's autocast."""
    device: str = "auto"
    """auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps."""


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def kv_cache_bytes(model: nn.Module, context: int, vocab_size: int) -> int:
    """Bytes of the K/V cache after a real forward over `context` tokens (batch 1)."""
    # drawn on the CPU generator so the tokens are the same on every device
    ids = torch.randint(0, vocab_size, (1, context), generator=torch.Generator().manual_seed(0)).to(_device(model))
    with torch.no_grad():
        out = model(ids, use_cache=True, logits_to_keep=1)
    return sum(t.nbytes for layer in out.cache.layers for t in (layer.keys, layer.values))


def greedy_sample(model, tokenizer, prompt: str, new_tokens: int) -> str:
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(_device(model))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def check_inspect_args(args: InspectArgs) -> None:
    """Every argument checked before anything loads."""
    check_args(args)
    as_precision(args.precision)
    canonical_mode(args.mode)


def inspect_model(model: nn.Module, tokenizer, args: InspectArgs) -> dict:
    check_inspect_args(args)
    family = family_of(model)
    norm = input_norm_of(model, family)
    d, n_layers = model.config.hidden_size, len(decoder_layers(model))
    base_params = count_parameters(model)
    p = as_precision(args.precision)
    config = PreProjConfig(mode=args.mode, adapter_dtype=p.adapter_dtype_name)
    torch.manual_seed(args.seed)
    adapted = attach(copy.deepcopy(model), config)
    per_layer = [
        {
            "layer": i,
            "attention": f"{family.layers}.{i}.{family.attention}",
            "reads": f"{family.layers}.{i}.{norm}" if norm else f"{family.layers}.{i} (its input: no norm)",
            "preproj": sum(p.numel() for p in w.preproj.parameters()) if w.preproj is not None else 0,
            "skip": w.skip.weight.numel() if w.skip is not None else 0,
        }
        for i, w in adapted_layers(adapted)
    ]
    added = trainable_parameters(adapted)
    kv, samples = None, None  # a vision model (preproj.vision) keeps no cache and generates nothing
    if tokenizer is not None:
        vocab = model.config.vocab_size
        with p.compute_context(_device(model)):
            kv_base, kv_adapted = (kv_cache_bytes(m, args.context, vocab) for m in (model, adapted))
            samples = {
                "prompt": args.prompt,
                "base": greedy_sample(model, tokenizer, args.prompt, args.new_tokens),
                "adapted (paper init)": greedy_sample(adapted, tokenizer, args.prompt, args.new_tokens),
            }
        kv = {"context": args.context, "base_bytes": kv_base, "adapted_bytes": kv_adapted,
              "ratio": kv_adapted / kv_base}
    return {
        "model": args.model,
        "model_type": model.config.model_type,
        "family": family.name,
        "hidden_size": d,
        "num_layers": n_layers,
        "base_params": base_params,
        "config": config.to_dict(),
        "layers": per_layer,
        "added": {
            "preproj": sum(r["preproj"] for r in per_layer),
            "skip": sum(r["skip"] for r in per_layer),
            "total": added,
            "percent_of_total": 100.0 * added / (base_params + added),
        },
        "kv_cache": kv,
        "samples": samples,
        "precision": p.name,
        "device": str(_device(model)),
        "supported_families": {f.name: {"model_types": list(f.model_types), "layers": f.layers,
                                        "attention": f.attention, "input_norm": f.input_norm,
                                        "lora_targets": f.lora_targets, "decision": f.decision} for f in FAMILIES},
    }


def _m(n: int) -> str:
    return f"{n / 1e6:.1f}M"


def format_report(r: dict) -> str:
    lines = [
        f"{r['model']}: {r['model_type']} ({r['family']} family), d={r['hidden_size']}, {r['num_layers']} layers, "
        f"{_m(r['base_params'])} parameters",
        f"adapter: mode={r['config']['mode']}, expansion={r['config']['expansion']}, "
        f"activation={r['config']['activation']}",
        "",
        f"{'layer':>5}  {'wrapped attention module':<28} {'normed input from':<34} {'pre-proj':>9} {'skip':>9}",
    ]
    for row in r["layers"]:
        lines.append(f"{row['layer']:>5}  {row['attention']:<28} {row['reads']:<34} "
                     f"{row['preproj']:>9,} {row['skip']:>9,}")
    a, kv = r["added"], r["kv_cache"]
    lines += ["", f"parameters added: pre-proj {_m(a['preproj'])} + skip {_m(a['skip'])} = {_m(a['total'])} "
                  f"({a['percent_of_total']:.1f}% of base+new)"]
    if kv:
        lines += [
            f"K/V cache at {kv['context']} tokens: base {kv['base_bytes']:,} B, adapted {kv['adapted_bytes']:,} B "
            f"(ratio {kv['ratio']:.3f})",
            "",
            f"greedy sample, prompt {r['samples']['prompt']!r}:",
            f"  base:                 {r['samples']['base']!r}",
            f"  adapted (paper init): {r['samples']['adapted (paper init)']!r}",
        ]
    else:
        lines.append("a vision model: bidirectional attention over whole inputs, no K/V cache and no samples")
    lines += [
        "",
        "supported families: " + "; ".join(f"{k} ({', '.join(v['model_types'])}: {v['layers']}.N.{v['attention']})"
                                           for k, v in r["supported_families"].items()),
    ]
    return "\n".join(lines)
