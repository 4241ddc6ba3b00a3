"""compare's figures: skip norms by depth against the paper's, paired differences, training curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .paper import PAPER_SKIP_NORMS


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 120) -> None:
    """The figure as a PNG of 256 colours without dithering (line plots lose nothing a reader sees, and the file is
    about a third of the full-colour one: committed reports stay small), written atomically."""
    import io

    from PIL import Image

    from ..runtime.files import atomic_write

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                                                         dither=Image.Dither.NONE)
    atomic_write(Path(path), lambda tmp: image.save(tmp, format="PNG", optimize=True))


def plot_skip_norms(norms: dict[str, list[float]], path: Path, model_name: str) -> None:
    """Ours on the left axis, the paper's Pythia curves on a second axis: the two trained at different rates and
    precisions, so their scales differ and only the shapes compare (the figure says so)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for method, values in norms.items():
        ax.plot(np.linspace(0, 1, len(values)), values, "o-", ms=3, label=f"{model_name} {method}")
    paper_ax = ax.twinx()
    for label, values in PAPER_SKIP_NORMS.items():
        paper_ax.plot(np.linspace(0, 1, len(values)), values, "--", color="gray" if "160" in label else "silver",
                      label=f"paper {label} (right axis)")
    ax.set_xlabel("layer depth (0 = first, 1 = last)")
    ax.set_ylabel(f"||W_skip||_F, {model_name}")
    paper_ax.set_ylabel("||W_skip||_F, paper (Pythia)", color="gray")
    ax.set_title("Content-skip norms by depth")
    fig.text(0.01, 0.01, "The paper trained at lr 1e-5 in bf16, these runs at their own swept rates: the scales "
             "differ, compare the shapes.", fontsize=7, color="dimgray")
    lines = ax.get_legend_handles_labels()
    more = paper_ax.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save_figure(fig, path)
    plt.close(fig)


def plot_paired(paired: list[dict], path: Path) -> None:
    """One panel per metric: each (method, reference) pair's paired difference with its 95% interval."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    metrics = list(dict.fromkeys(p["metric"] for p in paired))
    pairs = list(dict.fromkeys((p["method"], p["reference"]) for p in paired))
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.4 * len(metrics), 0.35 * len(pairs) + 1.9), sharey=True)
    for ax, metric in zip(np.atleast_1d(axes), metrics):
        for y, pair in enumerate(pairs):
            p = next((x for x in paired if (x["method"], x["reference"], x["metric"]) == (*pair, metric)), None)
            if p is None:
                continue
            color = {"better": "tab:green", "worse": "tab:red"}.get(p["verdict"], "tab:gray")
            ax.errorbar(p["effect"], y, xerr=[[p["effect"] - p["low"]], [p["high"] - p["effect"]]], fmt="o", ms=4,
                        color=color, capsize=2)
        ax.axvline(0, color="black", lw=0.8)
        lower = "perplexity" in metric or "loss" in metric
        ax.set_title(metric + (" (lower is better)" if lower else ""), fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))  # few ticks: wide ranges' labels would overlap
        ax.tick_params(labelsize=8)
        ax.tick_params(axis="x", labelrotation=30)
    axes = np.atleast_1d(axes)
    axes[0].set_yticks(range(len(pairs)), [f"{m} − {r}" for m, r in pairs])
    axes[0].invert_yaxis()
    fig.suptitle("Paired differences, 95% intervals (green better, red worse, grey not detectable; after correction)",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _smoothed(values: list[float]) -> np.ndarray:
    """A centred moving average over an eighth of the run (shorter at the ends), so that several noisy runs stay
    apart on one panel."""
    x = np.asarray(values, dtype=float)
    if len(x) < 3:
        return x
    half = max(9, len(x) // 8) // 2
    return np.array([x[max(0, i - half):i + half + 1].mean() for i in range(len(x))])


def plot_training_curves(runs: list[dict], path: Path) -> None:
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, r in enumerate(x for x in runs if x["log"]):
        color = colors[k % len(colors)]
        label = f"{r['method']} (seed {r['seed']})"
        steps = [x for x in r["log"] if "loss" in x]
        xs, ys = [x["step"] for x in steps], [x["loss"] for x in steps]
        a.plot(xs, ys, lw=0.6, alpha=0.25, color=color)
        a.plot(xs, _smoothed(ys), lw=1.4, color=color, label=label)
        held = [x for x in r["log"] if "heldout_loss" in x]
        b.plot([x["step"] for x in held], [x["heldout_loss"] for x in held], "o-", ms=3, color=color, label=label)
    a.set_title("train loss (moving average; raw faint)")
    b.set_title("held-out loss")
    for ax in (a, b):
        ax.set_xlabel("step")
    a.set_ylabel("cross-entropy (nats/token)")
    b.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
