"""`preproj scaling`: does a transformer trained from scratch with pre-projection and content skip beat a
plain one at matched parameters or compute? A grid of sizes x variants x seeds of `preproj pretrain`, one
shared tokenizer, every run resumable; then paired differences across seeds, curves and a report.

Variants: a method (preproj+skip, preproj, skip, base) or a plain model matched to preproj+skip of the
same shape, `base@params` or `base@flops` (its MLP widened until the count agrees within 2%).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..analysis.stats import describe, paired_t
from ..data import resolve_data_dir, training_corpus
from ..runtime.files import atomic_write, write_json
from ..runtime.precision import compute_context
from ..training.scratch import (
    PretrainArgs,
    Shape,
    build_model,
    count_params,
    make_tokenizer,
    pretrain,
    shape_of,
    shared_fields,
    train_flops_per_token,
)

logger = logging.getLogger(__name__)

REFERENCE = "preproj+skip"


@dataclass
class ScalingArgs:
    """Arguments of `preproj scaling`."""

    out: str = "runs/scaling"
    """Output directory: one pretrain run per size/variant/seed, report.md, results.json, plots."""
    sizes: str = "2x96,4x128"
    """Model sizes, LAYERSxD_MODEL, comma-separated; heads = d_model / 32 (the default is the CPU study's)."""
    variants: str = "preproj+skip,base@params,base@flops,base,skip"
    """preproj+skip, preproj, skip, base (plain, same shape), base@params and base@flops (plain, MLP widened to
    preproj+skip's parameters or training FLOPs per token)."""
    seeds: int = 3
    """Seeds per variant; seed i sets the initialisation and the data order of every variant's run i."""
    tokens: int = 1_000_000
    """Training tokens per run."""
    data: str = "wikitext2-train"
    """Training text (raw valid scores selection-free validation, raw test the reported perplexity)."""
    data_dir: str | None = None
    """Directory laid out as ../shared/data; default $PREPROJ_DATA_DIR."""
    tokenizer: str = "train:8192"
    """One tokenizer for every run: train:N (a BPE trained on the training text) or a model's."""
    seq_len: int = 128
    """Tokens per sequence."""
    batch_size: int = 16
    """Sequences per step."""
    lr: float = 3e-3
    """Peak learning rate, the same for every variant."""
    warmup: int = 20
    """Warmup steps."""
    precision: str = "auto"
    """Precision of every run (auto: bf16-mixed where bf16 matmuls are native, else fp32)."""
    device: str = "auto"
    """auto, cpu, cuda, cuda:N or mps."""
    eval_every: int = 50
    """Held-out loss every N steps (the loss-versus-tokens curves)."""
    timing_rounds: int = 5
    """Rounds of side-by-side step timing (adapted versus plain of the same shape) per size."""


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        layers, _, d = part.strip().partition("x")
        if not (layers.isdigit() and d.isdigit()) or int(d) % 32 or int(layers) < 1:
            raise ValueError(f"--sizes takes LAYERSxD_MODEL with D_MODEL a multiple of 32, e.g. 4x128; got {part!r}.")
        sizes.append((int(layers), int(d)))
    return sizes


VARIANTS = ("preproj+skip", "preproj", "skip", "base", "base@params", "base@flops")


def parse_variants(text: str) -> list[str]:
    variants = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or REFERENCE not in variants:
        raise ValueError(f"--variants takes {', '.join(VARIANTS)} and must include {REFERENCE}; got {text!r}.")
    return variants


def run_args(args: ScalingArgs, size: tuple[int, int], variant: str, seed: int) -> PretrainArgs:
    layers, d = size
    method, _, match = variant.partition("@")
    return PretrainArgs(**{
        **shared_fields(args, PretrainArgs), "out": str(Path(args.out) / f"{layers}x{d}" / variant / f"seed{seed}"),
        "layers": layers, "d_model": d, "heads": d // 32, "method": method, "match": match or None,
        "tokenizer": str(Path(args.out) / "tokenizer"), "seed": seed, "save_every": args.eval_every, "resume": True})


def _finished(out: Path) -> dict | None:
    path = out / "summary.json"
    if path.is_file():
        summary = json.loads(path.read_text())
        if "perplexity" in summary:
            return summary
    return None


def step_time_share(shape: Shape, tokenizer, args: ScalingArgs, device: torch.device) -> dict:
    """Seconds per training step (forward, backward, AdamW) of preproj+skip and of the plain model of the same
    shape, timed in alternating rounds in this one process; the modules' share is 1 - plain / adapted."""
    from ..methods.registry import build_method
    from ..training.schedule import make_optimizer

    models = {}
    for name in ("base", REFERENCE):
        model = build_method(build_model(shape, args.seq_len, tokenizer, 0, args.precision), name).requires_grad_(True)
        models[name] = (model.to(device).train(), make_optimizer(list(model.parameters()), 1e-4))
    ids = torch.randint(0, shape.vocab, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)

    def step(name: str) -> float:
        model, optimizer = models[name]
        start = time.perf_counter()
        with compute_context(args.precision, device):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    times = {name: [] for name in models}
    for name in models:
        step(name)  # warm-up
    for _ in range(args.timing_rounds):
        for name in models:
            times[name].append(statistics.median(step(name) for _ in range(3)))
    plain, adapted = statistics.median(times["base"]), statistics.median(times[REFERENCE])
    return {"plain_step_seconds": plain, "adapted_step_seconds": adapted, "modules_share": 1 - plain / adapted}


def run_scaling(args: ScalingArgs, progress: bool = True) -> dict:
    from transformers import AutoTokenizer

    from ..runtime.precision import precision as as_precision
    from ..runtime.precision import resolve_device

    sizes, variants = parse_sizes(args.sizes), parse_variants(args.variants)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(args.device)
    args = replace(args, precision=as_precision(args.precision, device).name)
    start = time.monotonic()

    # --- setup: one tokenizer for every run ---
    if not (out / "tokenizer" / "tokenizer.json").is_file():
        texts, _, _ = training_corpus(args.data, resolve_data_dir(args.data_dir))
        make_tokenizer(args.tokenizer, texts).save_pretrained(out / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")

    # --- fit: every run, skipping finished ones and resuming the rest ---
    runs, shapes = {}, {}
    for size in sizes:
        key = f"{size[0]}x{size[1]}"
        for variant in variants:
            shape = shape_of(run_args(args, size, variant, 0), len(tokenizer))
            plain = variant.startswith("base")
            same = next((v for v in variants if plain and v.startswith("base") and v != variant and (key, v) in shapes
                         and shapes[key, v] == shape), None)
            shapes[key, variant] = shape
            if same is not None:
                logger.info(f"[scaling] {key} {variant} is the same model as {same} (same width); its runs are shared")
                runs[key, variant] = runs[key, same]
                continue
            runs[key, variant] = []
            for seed in range(args.seeds):
                r = run_args(args, size, variant, seed)
                summary = _finished(Path(r.out))
                if summary is None:
                    logger.info(f"[scaling] {key} {variant} seed {seed} ...")
                    summary, _ = pretrain(r, progress=progress)
                runs[key, variant].append(summary)
            _write_results(out, args, runs, shapes, {}, start)

    # --- validate: timing, paired differences, report and plots ---
    timing = {}
    for size in sizes:
        key = f"{size[0]}x{size[1]}"
        timing[key] = step_time_share(shapes[key, REFERENCE], tokenizer, args, device)
    results = _write_results(out, args, runs, shapes, timing, start)
    _plots(out, results)
    (out / "report.md").write_text(report_markdown(results))
    return results


def _write_results(out: Path, args: ScalingArgs, runs: dict, shapes: dict, timing: dict, start: float) -> dict:
    sizes = {}
    for (key, variant), summaries in runs.items():
        shape = shapes[key, variant]
        method = variant.partition("@")[0]
        entry = sizes.setdefault(key, {"variants": {}, "paired": {}, "timing": timing.get(key)})
        entry["variants"][variant] = {
            "shape": asdict(shape), "params": count_params(shape, method),
            "train_flops_per_token": train_flops_per_token(shape, method, args.seq_len),
            "seeds": len(summaries),
            "test_loss": [s["loss"]["test"] for s in summaries if "test" in s["loss"]],
            "validation_loss": [s["loss"]["validation"] for s in summaries],
            "curves": [[(x["tokens"], x["heldout_loss"]) for x in _log(s)] for s in summaries],
            "skip_norms": [s.get("skip_norms") for s in summaries],
            "tokens_per_second": [s["tokens_per_second"] for s in summaries],
            "samples": summaries[0].get("samples") if summaries else None,
        }
    for key, entry in sizes.items():
        ref = entry["variants"].get(REFERENCE)
        for variant, v in entry["variants"].items():
            split = "test" if v["test_loss"] else "validation"  # text files have no separate test text
            ours, theirs = (ref or {}).get(f"{split}_loss", []), v[f"{split}_loss"]
            if variant == REFERENCE or not theirs or len(ours) != len(theirs):
                continue
            p = paired_t(theirs, ours, metric=f"{split} loss", higher_is_better=False)
            entry["paired"][variant] = {**p.to_dict(), "text": describe(p, 4)}
    results = {"args": asdict(args), "sizes": sizes, "wall_seconds": time.monotonic() - start}
    write_json(out / "results.json", results)
    return results


def _log(summary: dict) -> list[dict]:
    path = Path(summary["pretrain"]["out"]) / "train_log.jsonl"
    return [x for x in map(json.loads, path.read_text().splitlines()) if "heldout_loss" in x]


def report_markdown(results: dict) -> str:
    a = results["args"]
    lines = [
        "# preproj scaling: trained from scratch",
        "",
        f"Data {a['data']}, tokenizer {a['tokenizer']}, {a['tokens']:,} training tokens per run "
        f"({a['batch_size']} x {a['seq_len']} per step), lr {a['lr']} for every variant, {a['precision']}, "
        f"{a['seeds']} seeds; seed i gives every variant the same data order. Test perplexity on WikiText-2 raw test "
        "(every full window). The last column is preproj+skip's test loss minus the variant's (nats/token), the mean "
        "of the seed-paired differences with a t interval: negative means preproj+skip is better, and the verdict is "
        "preproj+skip's.",
        "",
    ]
    for key, entry in results["sizes"].items():
        lines += [f"## {key} (layers x d_model)", "",
                  "| variant | params | train FLOPs/token | val ppl | test ppl | preproj+skip - variant, test loss |",
                  "|---|---|---|---|---|---|"]
        for variant, v in entry["variants"].items():
            val = _mean_sd(v["validation_loss"], exp=True)
            test = _mean_sd(v["test_loss"], exp=True)
            paired = entry["paired"].get(variant, {}).get("text", "reference" if variant == REFERENCE else "")
            lines.append(f"| {variant} | {v['params'] / 1e6:.3f}M | {v['train_flops_per_token'] / 1e6:.2f}M | {val} | "
                         f"{test} | {paired} |")
        t = entry.get("timing")
        if t:
            lines += ["", f"Step time, side by side in one process: plain {t['plain_step_seconds'] * 1e3:.0f} ms, "
                          f"preproj+skip {t['adapted_step_seconds'] * 1e3:.0f} ms; the modules' share "
                          f"{100 * t['modules_share']:.0f}%."]
        lines.append("")
    lines += ["![loss versus tokens](loss_vs_tokens.png)", "![loss versus FLOPs](loss_vs_flops.png)",
              "![skip norms](skip_norms.png)", ""]
    return "\n".join(lines)


def _mean_sd(losses: list[float], exp: bool = False) -> str:
    if not losses:
        return "–"
    values = [math.exp(x) for x in losses] if exp else losses
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def _plots(out: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(results["sizes"].items())
    for name, x_of in (("loss_vs_tokens", lambda t, v: t), ("loss_vs_flops", lambda t, v: t * v["train_flops_per_token"])):
        fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
        for ax, (key, entry) in zip(axes[0], sizes):
            for variant, v in entry["variants"].items():
                curves = [c for c in v["curves"] if c]
                if not curves:
                    continue
                n = min(len(c) for c in curves)
                xs = [x_of(curves[0][i][0], v) for i in range(n)]
                ys = [statistics.mean(c[i][1] for c in curves) for i in range(n)]
                ax.plot(xs, ys, label=variant, marker=".")
            ax.set_title(key)
            ax.set_xlabel("training tokens" if name == "loss_vs_tokens" else "training FLOPs")
            ax.set_ylabel("held-out loss (raw valid), mean over seeds")
            ax.set_yscale("log")
            ax.legend()
        fig.tight_layout()
        atomic_write(out / f"{name}.png", lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
        plt.close(fig)
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, (key, entry) in zip(axes[0], sizes):
        for variant, v in entry["variants"].items():
            norms = [n for n in v["skip_norms"] if n]
            if norms:
                ax.plot(range(len(norms[0])), [statistics.mean(col) for col in zip(*norms)], marker="o", label=variant)
        ax.set_title(key)
        ax.set_xlabel("layer")
        ax.set_ylabel("||W_skip||_F, mean over seeds")
        ax.legend()
    fig.tight_layout()
    atomic_write(out / "skip_norms.png", lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)

