"""The report of `preproj scaling`: report.md's tables (sizes, variants, each family's seed-paired comparisons),
the curves of loss against tokens and FLOPs, the skip norms and the attention on the first token by depth."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from ..analysis.plots import save_figure
from ..training.probes import uniform_first_token_attention
from ..training.scratch_vision import ATTENTION_ITEMS


def report_markdown(results: dict) -> str:
    if results["args"].get("task", "text") != "text":
        return vision_markdown(results)
    a, plan = results["args"], results["plan"]
    rates = (f"each variant at the rate of --lrs {a['lrs']} whose sweep runs ({(a['sweep_tokens'] or a['tokens']):,} "
             f"tokens, {a['sweep_seeds']} seed(s)) ended with the lowest validation loss (raw valid)"
             if a.get("lrs") else f"lr {a['lr']} for every variant")
    correction = {"holm": "Holm", "benjamini-hochberg": "Benjamini-Hochberg"}
    lines = [
        "# preproj scaling: trained from scratch",
        "",
        f"Data {a['data']}, tokenizer {a['tokenizer']}, {a['tokens']:,} training tokens per run "
        f"({a['batch_size']} x {a['seq_len']} per step), {rates}, {a['precision']}, {a['seeds']} seeds; seed i gives "
        "every variant the same data order. Test perplexity on WikiText-2 raw test (every full window). The last "
        "columns are the variant's test loss minus the reference's (nats/token; negative: the variant is better), the "
        "mean of the seed-paired differences with a t interval and its p-value, adjusted by "
        f"{' and '.join(correction[f['correction']] + ' within ' + repr(f['name']) for f in plan['families'])} "
        f"({plan.get('declared', 'declared in analysis_plan.json before the runs')}); each verdict follows the "
        "adjusted p.",
        "",
    ]
    for key, entry in results["sizes"].items():
        refs = [f["reference"] for f in plan["families"]]
        lines += [f"## {key} (layers x d_model)", "",
                  "| variant | params | train FLOPs/token | lr | seeds | val ppl | test ppl | "
                  + " | ".join(f"− {r}, test loss" for r in refs) + " |",
                  "|---|---|---|---|---|---|---|" + "---|" * len(refs)]
        for variant, v in entry["variants"].items():
            cells = [_cell(entry, variant, r) for r in refs]
            lines.append(f"| {variant} | {v['params'] / 1e6:.3f}M | {v['train_flops_per_token'] / 1e6:.2f}M | "
                         f"{v.get('lr') or a['lr']:g} | {v['seeds']} | {_mean_sd(v['validation_loss'], exp=True)} | "
                         f"{_mean_sd(v['test_loss'], exp=True)} | " + " | ".join(cells) + " |")
        sinks = {n: _mean_of_layers(entry["variants"][n].get("first_token_attention"))
                 for n in distinct(entry["variants"])}
        if any(x is not None for x in sinks.values()):
            lines += ["", "Attention on the first token of a window (mean over layers, heads, later queries, held-out "
                          "windows and seeds; by layer in sink.png): "
                      + ", ".join(f"{variant} {x:.3f}" for variant, x in sinks.items() if x is not None)
                      + ". " + sink_reading(entry, uniform_first_token_attention(a["seq_len"]))]
        t = entry.get("timing")
        if t:
            lines += ["", f"Step time, side by side in one process: plain {t['plain_step_seconds'] * 1e3:.0f} ms, "
                          f"preproj+skip {t['adapted_step_seconds'] * 1e3:.0f} ms; the modules' share "
                          f"{100 * t['modules_share']:.0f}%."]
        lines.append("")
    lines += ["![loss versus tokens](loss_vs_tokens.png)", "![loss versus FLOPs](loss_vs_flops.png)",
              "![skip norms](skip_norms.png)"]
    if _has_sink(results):
        lines.append("![attention on the first token](sink.png)")
    return "\n".join(lines) + "\n"


def vision_markdown(results: dict) -> str:
    """A vision grid's report: per size, each variant's counts, rate, losses and accuracies (mean ± sd over seeds),
    the position-shuffle probe, and each family's item-and-seed-paired differences on every metric."""
    a, plan = results["args"], results["plan"]
    budget = f"{a['epochs']:g} epoch(s)" if a.get("epochs") else f"{a['tokens']:,} tokens"
    rates = (f"each variant at the rate of --lrs {a['lrs']} with the lowest validation loss" if a.get("lrs")
             else f"lr {a['lr']} for every variant")
    lines = [f"# preproj scaling: {a['task']}, trained from scratch", "",
             f"{budget} per run, batch {a['batch_size']}, {rates}, {a['precision']}, {a['seeds']} seeds; seed i gives "
             "every variant the same initialisation and data order. *Shuffled*: the test items with their given tokens "
             "permuted and the RoPE positions kept in place. Differences are the variant's minus the reference's over "
             "the test items and the seeds (the plan's rule), with the family's correction "
             f"({plan.get('declared', 'declared in analysis_plan.json before the runs')}).", ""]
    for key, entry in results["sizes"].items():
        variants = entry["variants"]
        accuracy = any(v.get("test_accuracy") for v in variants.values())
        lines += [f"## {key} (layers x d_model)", "",
                  "| variant | params | train FLOPs/token | lr | seeds | val loss | test loss | shuffled loss |"
                  + (" test acc | shuffled acc |" if accuracy else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|---|" if accuracy else "")]
        for variant, v in variants.items():
            lines.append(f"| {variant} | {v['params'] / 1e6:.3f}M | {v['train_flops_per_token'] / 1e6:.2f}M | "
                         f"{v.get('lr') or a['lr']:g} | {v['seeds']} | {_mean_sd(v['validation_loss'], digits=4)} | "
                         f"{_mean_sd(v['test_loss'], digits=4)} | {_mean_sd(v['shuffled_test_loss'], digits=4)} |"
                         + (f" {_mean_sd(v['test_accuracy'], digits=4)} | "
                            f"{_mean_sd(v['shuffled_test_accuracy'], digits=4)} |" if accuracy else ""))
        lines += sweep_lines(variants)
        lines += by_layer_line(variants, "skip_norms",
                               "The skip's Frobenius norm by layer (mean over the seeds; skip_norms.png)")
        if any(v.get("attention_distance") for v in variants.values()):
            even = next(iter(variants.values()))["uniform_attention_distance"]
            lines += by_layer_line(variants, "attention_distance", "Mean attention distance by layer, in tokens (over "
                                   f"heads, queries, {ATTENTION_ITEMS} test items and the seeds; attention spread "
                                   f"evenly gives {even:.2f}; attention_distance.png)")
        lines += peak_reading(variants)
        for family in plan["families"]:
            reference, rows = family["reference"], entry["paired"].get(family["reference"], {})
            if rows:
                lines += ["", f"Against {reference} ({family['name']}, {family['correction']}):", ""]
                lines += [f"- {variant}, {metric}: {m['text']}" for variant, by_metric in rows.items()
                          for metric, m in by_metric.items()]
        lines.append("")
    lines += ["![loss versus tokens](loss_vs_tokens.png)", "![loss versus FLOPs](loss_vs_flops.png)",
              "![skip norms](skip_norms.png)", "![attention distance](attention_distance.png)",
              "![attention received by position](attention_received.png)"]
    return "\n".join(lines) + "\n"


def sweep_lines(variants: dict) -> list[str]:
    """The learning-rate sweep's validation losses (mean over its seeds), the chosen rate in bold ([] without one)."""
    swept = {n: variants[n]["sweep"] for n in distinct(variants) if variants[n].get("sweep")}
    if not swept:
        return []
    rates = sorted({r for sweep in swept.values() for r in sweep}, key=float)

    def cell(losses: list | None, chosen: bool) -> str:
        if not losses or None in losses:
            return "diverged" if losses else ""
        text = f"{sum(losses) / len(losses):.4f}"
        return f"**{text}**" if chosen else text

    edges = {float(rates[0]): "lowest", float(rates[-1]): "highest"} if len(rates) > 1 else {}
    at_edge = [f"{n} ({edges[variants[n]['lr']]})" for n in swept if variants[n]["lr"] in edges]
    return ["", "Validation loss at the end of each sweep run (the chosen rate in bold):", "",
            "| variant | " + " | ".join(f"lr {r}" for r in rates) + " |", "|---|" + "---|" * len(rates)] + [
        f"| {n} | " + " | ".join(cell(sweep.get(r), float(r) == variants[n]["lr"]) for r in rates) + " |"
        for n, sweep in swept.items()] + ([
            "", "Chosen at an end of the swept rates, so that a better rate may lie beyond it: "
            + ", ".join(at_edge) + "."] if at_edge else [])


def by_layer_line(variants: dict, field: str, said: str) -> list[str]:
    """'said: variant x0, x1, ...; ...' from each variant's per-seed, per-layer `field` (mean over the seeds), once
    per set of runs ([] where no variant has it)."""
    means = {n: _layer_means(variants[n].get(field)) for n in distinct(variants)}
    shown = [f"{n} " + ", ".join(f"{x:.2f}" for x in m) for n, m in means.items() if m]
    return ["", f"{said}: " + "; ".join(shown) + "."] if shown else []


def peak_reading(variants: dict) -> list[str]:
    """The share of the most-attended position by layer, per variant with runs of its own ([] without the probe)."""
    peaks = {n: m.reshape(len(m), -1).max(axis=1) for n, m in _received_by_variant(variants).items()}
    if not peaks:
        return []
    return ["", "The most-attended position's share by layer, as a multiple of an even share (mean over heads, "
                f"queries, {ATTENTION_ITEMS} test items and the seeds; every position in attention_received.png): "
            + "; ".join(f"{n} " + ", ".join(f"{x:.2f}" for x in p) for n, p in peaks.items()) + "."]


def sink_reading(entry: dict, even: float) -> str:
    """Where a sink has formed: the layers whose first-token attention (mean over seeds) exceeds the even level."""
    said = f"Attention spread evenly over the tokens each query sees would put {even:.3f} there"
    probes = {n: entry["variants"][n].get("first_token_attention") for n in distinct(entry["variants"])}
    above = [f"{variant} layer {layer} ({x:.3f})" for variant, per_seed in probes.items()
             for layer, x in enumerate(_layer_means(per_seed)) if x > even]
    if above:
        return f"{said}; above it (a sink), mean over seeds: {', '.join(above)}."
    values = [x for per_seed in probes.values() for run in _finished(per_seed) for x in run]
    return (f"{said}, and no layer of any run reaches it ({min(values):.3f} to {max(values):.3f}): no sink has "
            "formed.")


def _has_sink(results: dict) -> bool:
    return any(_mean_of_layers(v.get("first_token_attention")) is not None for e in results["sizes"].values()
               for v in e["variants"].values())


def _cell(entry: dict, variant: str, reference: str) -> str:
    if variant == reference:
        return "reference"
    if variant in entry["paired"].get(reference, {}):
        return entry["paired"][reference][variant]["text"]
    shared = _first_with_the_same_runs(entry["variants"], variant)
    if shared != variant:
        return f"the runs of {shared}"
    if reference in entry["paired"].get(variant, {}):  # compared the other way round, in an earlier family
        return f"row {reference}, column − {variant}"
    return ""


def distinct(variants: dict) -> list[str]:
    """The variants that do not share their runs with an earlier one (base@flops at base@params's width)."""
    return [name for name in variants if _first_with_the_same_runs(variants, name) == name]


def _first_with_the_same_runs(variants: dict, name: str) -> str:
    runs = tuple(variants[name]["validation_loss"])
    return next(n for n, v in variants.items() if tuple(v["validation_loss"]) == runs)


def _finished(per_seed: list | None) -> list[list[float]]:
    """The per-layer values of the seeds that have them (a run from before a probe existed has none)."""
    return [r for r in per_seed or [] if r]


def _layer_means(per_seed: list | None) -> list[float]:
    return [statistics.mean(column) for column in zip(*_finished(per_seed))]


def _mean_of_layers(per_seed: list | None) -> float | None:
    runs = _finished(per_seed)
    return statistics.mean(statistics.mean(r) for r in runs) if runs else None


def _mean_sd(losses: list[float], exp: bool = False, digits: int = 2) -> str:
    if not losses:
        return "–"
    values = [math.exp(x) for x in losses] if exp else losses
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def plots(out: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(results["sizes"].items())
    task = results["args"].get("task", "text")
    unit = {"text": "tokens", "mnist": "patches"}.get(task, "tubelets")
    heldout = "held-out loss (raw valid)" if task == "text" else "validation loss"
    for name, x_of in (("loss_vs_tokens", lambda t, v: t),
                       ("loss_vs_flops", lambda t, v: t * v["train_flops_per_token"])):
        fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
        for ax, (key, entry) in zip(axes[0], sizes):
            for variant in distinct(entry["variants"]):
                v = entry["variants"][variant]
                curves = [c for c in v["curves"] if c]
                if not curves:
                    continue
                n = min(len(c) for c in curves)
                xs = [x_of(curves[0][i][0], v) for i in range(n)]
                ys = [statistics.mean(c[i][1] for c in curves) for i in range(n)]
                ax.plot(xs, ys, label=variant, marker=".")
            ax.set_title(key)
            ax.set_xlabel(f"training {unit}" if name == "loss_vs_tokens" else "training FLOPs")
            ax.set_ylabel(f"{heldout}, mean over seeds")
            ax.set_yscale("log")
            ax.legend()
        fig.tight_layout()
        save_figure(fig, out / f"{name}.png", dpi=110)
        plt.close(fig)
    _by_layer(plt, out / "skip_norms.png", sizes, "skip_norms", "||W_skip||_F, mean over seeds")
    if results["args"].get("task", "text") != "text":
        even = next(iter(sizes[0][1]["variants"].values()))["uniform_attention_distance"]
        _by_layer(plt, out / "attention_distance.png", sizes, "attention_distance",
                  "mean attention distance (tokens), mean over seeds", even=even)
        _received_plot(plt, out / "attention_received.png", sizes)
    if _has_sink(results):
        _by_layer(plt, out / "sink.png", sizes, "first_token_attention",
                  "attention on the first token, mean over seeds",
                  even=uniform_first_token_attention(results["args"]["seq_len"]))


def received_maps(shape: dict, per_seed: list | None) -> np.ndarray | None:
    """The attention each token position receives by layer (mean over seeds, heads, queries and items), as a multiple
    of an even share: (layers, rows, columns) for an image's patches, (layers, time slots) for a clip's tubelets
    (each slot's mean over its patches). None where no seed has the probe."""
    runs = _finished(per_seed)
    if not runs:
        return None
    received = np.mean(np.asarray(runs, dtype=float), axis=0)  # (layers, tokens)
    received = received * received.shape[1]
    if "image_size" in shape:
        grid = shape["image_size"] // shape["patch_size"]
        return received.reshape(len(received), grid, grid)
    return received.reshape(len(received), shape["frames"] // shape["tubelet"], -1).mean(axis=2)


def _received_by_variant(variants: dict) -> dict[str, np.ndarray]:
    """received_maps for each variant with runs of its own that have the probe."""
    maps = {n: received_maps(variants[n]["shape"], variants[n].get("attention_received")) for n in distinct(variants)}
    return {n: m for n, m in maps.items() if m is not None}


def _received_plot(plt, path: Path, sizes: list) -> None:
    """Images: one heat map per variant (rows) and layer (columns) of the share each patch receives. Clips: one
    panel per layer, the share each time slot receives by variant, the first predicted slot marked."""
    key, entry = sizes[-1]  # the largest size: a grid of heat maps per size would not read
    maps = _received_by_variant(entry["variants"])
    if not maps:
        return
    layers = len(next(iter(maps.values())))
    if next(iter(maps.values())).ndim == 3:
        top = max(float(m.max()) for m in maps.values())
        fig, axes = plt.subplots(len(maps), layers, figsize=(1.6 * layers + 1, 1.6 * len(maps)), squeeze=False)
        for row, (name, m) in zip(axes, maps.items()):
            for layer, ax in enumerate(row):
                image = ax.imshow(m[layer], vmin=0, vmax=top, cmap="viridis")
                ax.set_xticks([])
                ax.set_yticks([])
                if layer == 0:
                    ax.set_ylabel(name, fontsize=8)
                if name == next(iter(maps)):
                    ax.set_title(f"layer {layer}", fontsize=8)
        fig.colorbar(image, ax=axes, label="attention received / even share")
    else:
        fig, axes = plt.subplots(1, layers, figsize=(3.2 * layers, 3.2), squeeze=False, sharey=True)
        shape = entry["variants"][next(iter(maps))]["shape"]
        for layer, ax in enumerate(axes[0]):
            for name, m in maps.items():
                ax.plot(range(m.shape[1]), m[layer], marker=".", label=name)
            if shape.get("objective") == "next-frame":
                ax.axvline(shape["context"] // shape["tubelet"] - 0.5, color="grey", linestyle="--",
                           label="first predicted slot")
            ax.axhline(1.0, color="grey", linestyle=":")
            ax.set_title(f"{key}, layer {layer}")
            ax.set_xlabel("time slot")
        axes[0][0].set_ylabel("attention received / even share")
        axes[0][-1].legend(fontsize=7)
        fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def _by_layer(plt, path: Path, sizes: list, field: str, ylabel: str, even: float | None = None) -> None:
    """One panel per size: each variant's per-layer `field`, mean over the seeds that have it; `even`, where given,
    as a dashed reference line."""
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, (key, entry) in zip(axes[0], sizes):
        for variant in distinct(entry["variants"]):
            means = _layer_means(entry["variants"][variant].get(field))
            if means:
                ax.plot(range(len(means)), means, marker="o", label=variant)
        if even is not None:
            ax.axhline(even, color="grey", linestyle="--", label="attention spread evenly")
        ax.set_title(key)
        ax.set_xlabel("layer")
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
