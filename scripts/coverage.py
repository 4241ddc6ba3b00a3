"""The coverage map of preproj's paired intervals: how often each rule's 95% interval covers the true difference.

Simulated comparisons over a grid that brackets the CPU study's own regimes (results/study-cpu: 62 to 5,153 items,
3 seeds against 3 or against the base's 1, seed spreads from none to several item standard errors and unequal
between the two arms, seed-by-item interaction from none to large, binary and ratio-of-sums metrics). Nothing
here reads the study's results; the grid's scales were read off its variance components once (results/coverage.md).

    .venv/bin/python scripts/coverage.py --sims 2000            # writes results/coverage.{md,json}

Each rule (preproj.analysis.stats.RULES) is applied exactly as `compare` applies it, seed-paired where both arms share
seeds and item-and-seed otherwise. The chosen rule is the narrowest that covers >= 94.5% in every cell where any
rule can: with one seed an arm's own seed variance cannot be seen, so the single seed must be the base's (which
has none); a cell with a varying single-seed arm is shown, not used to choose.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import norm

from preproj.analysis.stats import RULES, accuracy, intervals_by_rule, ratio_of_sums

# (metric, items): binary 0/1 items (LAMBADA 5,153, HellaSwag 1,000, ARC-E 2,376) and documents scored as a ratio
# of sums (WikiText-2 test: 62 documents)
SIZES = [("binary", 500), ("binary", 5000), ("ratio", 62), ("ratio", 500)]
# Seed standard deviations on the latent scale, per metric: none, small, medium, large. On the binary scale 0.065
# moves accuracy by about 0.024, the study's widest seed spread (LoRA, ARC-E); ratio: nats/token, up to 0.026.
SEED_SD = {"binary": (0.0, 0.0135, 0.03, 0.08), "ratio": (0.0, 0.003, 0.01, 0.03)}
# Seed-by-item interaction: none, medium, large. Binary: 0.15 makes two seeds disagree on about 10% of items
# (the study: 7-20%); ratio: per-document nats/token (the study: about 0.01-0.03).
INTERACTION = {"binary": (0.0, 0.15, 0.5), "ratio": (0.0, 0.01, 0.05)}
# (sd of arm A's seeds, of arm B's) as indices into SEED_SD
REGIMES_3V3 = {"none": (0, 0), "equal small": (1, 1), "equal medium": (2, 2), "dominant": (3, 3),
               "unequal": (1, 3), "unequal reversed": (3, 1)}
REGIMES_3V1 = {"none": (0, 0), "small": (0, 1), "medium": (0, 2), "dominant": (0, 3), "single seed varies": (2, 2)}
BETA = {"binary": (-0.40, -0.35), "ratio": (0.0, -0.01)}  # arm A, arm B on the latent scale
# Each arm's own item-by-item deviation, the same for all its seeds (two methods get different items right): binary
# 0.3 makes the arms disagree on about 10% of items, ratio 0.02 nats/token per document.
ARM_BY_ITEM = {"binary": 0.3, "ratio": 0.02}


def simulate(rng, metric: str, items: int, seeds: tuple[int, int], sd: tuple[float, float], interaction: float,
             rho: float, beta: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-item values of arms A and B on the same items, and the true difference B - A over items and seeds.
    `beta`: the arms' latent means (default BETA's; a study regime's are fitted to its data)."""
    beta = beta or BETA[metric]
    difficulty = rng.normal(0, 1 if metric == "binary" else 0.3, items)
    shared = rng.normal(0, 1, max(seeds))  # seed i is the same data order for both arms: correlated seed effects
    arms = []
    for arm, (n, s) in enumerate(zip(seeds, sd)):
        own = rng.normal(0, 1, n)
        seed_effect = s * (rho * shared[:n] + math.sqrt(1 - rho ** 2) * own) if n > 1 else s * own
        latent = (difficulty + rng.normal(0, ARM_BY_ITEM[metric], items) + beta[arm] + seed_effect[:, None]
                  + rng.normal(0, interaction or 1e-300, (n, items)))
        arms.append(latent)
    if metric == "binary":
        spread = [1 + ARM_BY_ITEM[metric] ** 2 + sd[k] ** 2 + interaction ** 2 for k in (0, 1)]
        truth = [norm.cdf(beta[k] / math.sqrt(spread[k])) for k in (0, 1)]
        return (arms[0] > 0).astype(float), (arms[1] > 0).astype(float), truth[1] - truth[0]
    counts = rng.lognormal(math.log(4000), 0.5, items)
    values = [np.stack([(3.0 + x) * counts, np.broadcast_to(counts, x.shape)], axis=-1) for x in arms]
    return values[0], values[1], beta[1] - beta[0]


def cell_coverage(metric: str, items: int, seeds: tuple[int, int], sd: tuple[float, float], interaction: float,
                  rho: float, sims: int, seed: int, beta: tuple[float, float] | None = None) -> dict:
    """Coverage, mean width and power (how often the interval excludes zero, at the cell's true difference) of every
    rule, item-and-seed and (equal seeds) seed-paired, over `sims` simulations."""
    rng = np.random.default_rng(seed)
    statistic = accuracy if metric == "binary" else ratio_of_sums
    tests = [False, True] if seeds[0] == seeds[1] > 1 else [False]
    hits = {(t, r): 0 for t in tests for r in RULES}
    width = {(t, r): 0.0 for t in tests for r in RULES}
    rejects = {(t, r): 0 for t in tests for r in RULES}
    for _ in range(sims):
        a, b, truth = simulate(rng, metric, items, seeds, sd, interaction, rho, beta)
        for paired_seeds in tests:
            for rule, (low, high) in intervals_by_rule(a, b, statistic, seed_paired=paired_seeds).items():
                hits[paired_seeds, rule] += low - 1e-12 <= truth <= high + 1e-12  # float rounding of a zero width
                width[paired_seeds, rule] += high - low
                rejects[paired_seeds, rule] += low > 0 or high < 0
    return {("seed-paired" if t else "item-and-seed") + ": " + r:
            {"coverage": hits[t, r] / sims, "width": width[t, r] / sims, "power": rejects[t, r] / sims}
            for t, r in hits}


def grid() -> list[dict]:
    cells = []
    for (metric, items), (seeds, regimes) in itertools.product(SIZES, [((3, 3), REGIMES_3V3), ((1, 3), REGIMES_3V1)]):
        for (regime, (i, j)), k in itertools.product(regimes.items(), range(3)):
            for rho in ((0.0, 0.8) if seeds == (3, 3) else (0.0,)):
                cells.append({"metric": metric, "items": items, "seeds": seeds, "regime": regime,
                              "sd": (SEED_SD[metric][i], SEED_SD[metric][j]), "interaction": INTERACTION[metric][k],
                              "rho": rho, "usable": regime != "single seed varies"})
    return cells


# The study's own regimes: pairs of results/study-cpu whose variance components are fitted to the committed per-item
# records, each also projected to the confirmatory study's 5 seeds per arm (studies/confirmatory.toml).
STUDY_PAIRS = [("lambada.acc", "lora", "skip"), ("lambada.acc", "base", "skip"), ("arc_easy.acc", "lora", "skip"),
               ("wikitext_file.heldout_loss", "base", "preproj+skip"), ("wikitext_file.heldout_loss", "lora", "skip")]


def _arm_values(study: Path, method: str, task: str) -> np.ndarray:
    """(seeds, items, ...) values of TASK.METRIC for every seed of `method` in `study`."""
    from preproj.analysis.pairing import item_values
    from preproj.evaluation.tasks import paired_metrics

    task, name = task.split(".")
    metric = next(m for t, m in paired_metrics("harness") if t == task and m.name == name)
    runs = sorted(study.glob(f"{method}-seed*"), key=lambda d: int(d.name.rsplit("seed", 1)[1]))
    return item_values([d / f"items.{task}.jsonl" for d in runs], task, metric.item_value)


def _fit_binary(y: np.ndarray) -> tuple[float, float, float]:
    """(latent mean, seed sd, seed-by-item interaction) of one arm's 0/1 items (seeds x items) under simulate()'s
    model: item i right at seed s when d_i + a_i + beta + sd z_s + interaction e_si > 0. The interaction matches the
    rate at which two seeds disagree, the mean the accuracy, the seed sd the between-seed variance of accuracy less
    the part the interaction alone gives on these items."""
    v0 = 1 + ARM_BY_ITEM["binary"] ** 2
    x = np.random.default_rng(0).normal(0, math.sqrt(v0), 200_000)
    acc = y.mean(axis=1)
    if len(y) > 1:
        pairs = [(a, b) for a in range(len(y)) for b in range(a + 1, len(y))]
        disagree = float(np.mean([np.mean(y[a] != y[b]) for a, b in pairs]))
    else:
        disagree = 0.0
    beta = float(norm.ppf(acc.mean()) * math.sqrt(v0))

    def rate(tau: float) -> float:
        p = norm.cdf((x + beta) / max(tau, 1e-9))
        return float(np.mean(2 * p * (1 - p)))

    low, high = 0.0, 5.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if rate(mid) < disagree else (low, mid)
    tau = (low + high) / 2 if disagree > 0 else 0.0
    spread = v0 + tau ** 2
    beta = float(norm.ppf(acc.mean()) * math.sqrt(spread))
    p = norm.cdf((x + beta) / max(tau, 1e-9))
    noise = float(np.mean(p * (1 - p))) / y.shape[1]
    between = float(acc.var(ddof=1)) if len(y) > 1 else 0.0
    slope = norm.pdf(beta / math.sqrt(spread)) / math.sqrt(spread)
    sd = math.sqrt(max(0.0, between - noise)) / slope
    return beta, sd, tau


def _fit_ratio(v: np.ndarray) -> tuple[float, float, float]:
    """(mean nats per token less 3, seed sd, seed-by-document interaction) of one arm's (nll, tokens) documents."""
    v = np.abs(v)  # (-log-likelihood, tokens): the sign of the first is the record's convention
    rate = v[..., 0] / v[..., 1]  # seeds x documents
    overall = v[..., 0].sum(axis=1) / v[..., 1].sum(axis=1)
    if len(v) == 1:
        return float(overall.mean() - 3.0), 0.0, 0.0
    n = len(v)
    residual = rate - rate.mean(axis=0, keepdims=True) - (rate.mean(axis=1, keepdims=True) - rate.mean())
    tau = float(np.sqrt((residual ** 2).sum() / ((n - 1) * (rate.shape[1] - 1))))
    weights = v[0, :, 1] / v[0, :, 1].sum()
    sd = math.sqrt(max(0.0, float(overall.var(ddof=1)) - tau ** 2 * float((weights ** 2).sum())))
    return float(overall.mean() - 3.0), sd, tau


def study_cells(study: Path) -> list[dict]:
    """Cells with the variance components of STUDY_PAIRS fitted to `study`'s per-item records: as run (3 v 3 or the
    base's 1 v 3) and with 5 seeds per arm, both with uncorrelated and correlated seed effects."""
    cells = []
    for name, reference, method in STUDY_PAIRS:
        metric = "binary" if name.endswith(".acc") else "ratio"
        fit = _fit_binary if metric == "binary" else _fit_ratio
        a, b = (_arm_values(study, m, name) for m in (reference, method))
        (beta_a, sd_a, tau_a), (beta_b, sd_b, tau_b) = fit(a), fit(b)
        taus = [t for t, arm in ((tau_a, reference), (tau_b, method)) if arm != "base"]
        seeds, items = (len(a), len(b)), b.shape[1]
        for n in (seeds, (5, 5) if seeds[0] > 1 else (1, 5)):
            for rho in ((0.0, 0.8) if n[0] > 1 else (0.0,)):
                cells.append({"metric": metric, "items": int(items), "seeds": n, "sd": (sd_a, sd_b),
                              "interaction": float(np.mean(taus)), "rho": rho, "beta": (beta_a, beta_b),
                              "regime": f"{study.name}: {method} - {reference}, {name}", "usable": True,
                              "study": True})
    return cells


def _key(c: dict) -> str:
    return _name(c) + (f", sd {c['sd'][0]:.4g} {c['sd'][1]:.4g}" if c.get("study") else "")


def choose(cells: list[dict], floor: float = 0.945) -> dict:
    """The narrowest rule (mean width over the usable cells of both tests) that covers >= floor in every usable cell of
    both; with the rules that qualify and each rule's worst cell."""
    worst, width = {}, {}
    for rule in RULES:
        found = [c["result"][f"{t}: {rule}"] for c in cells if c["usable"] for t in ("item-and-seed", "seed-paired")
                 if f"{t}: {rule}" in c["result"]]
        worst[rule] = min(x["coverage"] for x in found)
        width[rule] = float(np.mean([x["width"] for x in found]))
    qualify = [r for r in RULES if worst[r] >= floor]
    return {"rule": min(qualify, key=width.get) if qualify else None, "qualify": qualify, "worst": worst,
            "width": width}


def recheck(cells: list[dict], sims: int, low: float = 0.925, floor: float = 0.945,
            only: set[int] | None = None) -> list[int]:
    """Simulate again, `sims` more times, every usable cell where a rule that is near the floor everywhere (worst
    cell >= low) falls below it, and pool the counts: at 1,000 simulations a rule that covers exactly 95% falls
    below 94.5% in about a quarter of the cells by chance alone, so those cells need more before a rule is ruled out."""
    near = [r for r, w in choose(cells)["worst"].items() if w >= low]
    again = [k for k, c in enumerate(cells) if c["usable"] and (only is None or k in only) and any(
        x["coverage"] < floor for key, x in c["result"].items() if key.split(": ")[1] in near)]
    for k in again:
        c = cells[k]
        more = cell_coverage(c["metric"], c["items"], tuple(c["seeds"]), tuple(c["sd"]), c["interaction"], c["rho"],
                             sims, seed=10_000 + k, beta=tuple(c["beta"]) if c.get("beta") else None)
        total = c.get("sims", 0) + sims
        for key, x in more.items():
            old = c["result"][key]
            n_old = c.get("sims", total - sims)
            c["result"][key] = {name: (old[name] * n_old + x[name] * sims) / total for name in x if name in old}
        c["sims"] = total
        print(f"[coverage] rechecked {_name(c)} with {sims} more: " + ", ".join(
            f"{key} {c['result'][key]['coverage']:.3f}" for key in c["result"] if key.split(": ")[1] in near),
            file=sys.stderr, flush=True)
    return again


def render(cells: list[dict], chosen: dict, sims: int, seconds: float, command: str = "") -> str:
    keys = sorted({k for c in cells for k in c["result"]}, key=lambda k: (k.startswith("seed"), k))
    grid_sims = min(c.get("sims", sims) for c in cells if not c.get("study"))
    study_sims = [c.get("sims", sims) for c in cells if c.get("study")]
    counts = (f"Each grid cell is at least {grid_sims} simulated comparisons (more where rechecked, as its row says)"
              + (f", each cell of the study's own regimes {min(study_sims)}" if study_sims else ""))
    lines = ["# Coverage of the paired intervals", "",
             f"`.venv/bin/python scripts/coverage.py {command or f'--sims {sims}'}` (this pass: {seconds / 60:.0f} "
             f"min on the project's 2-core CPU). {counts}: two arms on the same items; a rule covers when its 95% "
             "interval holds the true difference over items and seeds. Monte Carlo standard error of a coverage near "
             f"95%: {math.sqrt(0.95 * 0.05 / grid_sims) * 100:.1f} points at {grid_sims} simulations"
             + (f", {math.sqrt(0.95 * 0.05 / min(study_sims)) * 100:.1f} at {min(study_sims)}" if study_sims else "")
             + ".", "",
             "Rules (`preproj.analysis.stats.RULES`): each arm's seed variance is its between-seed variance less the "
             "seed-by-item interaction that the items' variance already carries (*subtract*), or the raw between-seed "
             "variance (*raw*, which counts the interaction twice). *n-1 df* gives that estimate the seeds' n - 1 "
             "degrees of freedom; *Satterthwaite df* the fewer that a difference of two mean squares has; both then "
             "combine the seeds' and the items' parts by Welch-Satterthwaite. *t(n-1) for all* takes the seeds' "
             "t-quantile for the whole interval; *separate quantiles* gives the items' part the normal quantile and "
             "each seed part its own t(n-1), added in quadrature. *seed-paired* (both arms trained with the same "
             "seeds, seed i the same data order) takes the seeds' part from the per-seed differences; *item-and-seed* "
             "from each arm's own seeds.", "",
             "## Chosen", "",
             f"**{chosen['rule'] or 'no rule covers everywhere'}**: the narrowest rule (mean width over the usable "
             "cells of both tests) that covers at least 94.5% in every usable cell, item-and-seed and seed-paired. "
             "Rules that qualify: " + (", ".join(chosen["qualify"]) or "none") + ". A cell where a rule that comes "
             "near the floor everywhere fell below it was simulated again and the counts pooled (the cell's "
             "simulations are listed below): at 1,000 simulations a rule that covers exactly 95% falls below 94.5% in "
             "about a quarter of the cells by chance alone. Cells where the single-seed arm itself varies are shown "
             "but not usable: no interval can see a spread from one seed, which is why every trained arm of the study "
             "has three seeds and only the base (which has no seed variance) has one.", "",
             "| rule | worst usable cell | mean width |", "|---|---|---|",
             *[f"| {rule} | {chosen['worst'][rule]:.3f} | {chosen['width'][rule]:.4g} |" for rule in RULES], "",
             "## Worst cell per rule", "", "| test: rule | lowest coverage | in cell | mean width (usable cells) |",
             "|---|---|---|---|"]
    for key in keys:
        usable = [c for c in cells if c["usable"] and key in c["result"]]
        worst = min(usable, key=lambda c: c["result"][key]["coverage"])
        lines.append(f"| {key} | {worst['result'][key]['coverage']:.3f} | {_name(worst)} | "
                     f"{np.mean([c['result'][key]['width'] for c in usable]):.4g} |")
    study = [c for c in cells if c.get("study")]
    if study:
        lines += ["", "## The study's own regimes", "",
                  "Cells whose variance components were fitted to the committed per-item records of the study they "
                  "name (scripts/coverage.py, study_cells): the latent mean of each arm, its seed spread and the "
                  "seed-by-item interaction, as run and with the 5 seeds per arm of the confirmatory study, with "
                  "uncorrelated and correlated seed effects (ρ). The true difference is the one fitted, so *power* is "
                  "how often each rule's interval excludes zero at the study's own effect. Each entry: coverage / "
                  "power.",
                  "", "| cell | " + " | ".join(keys) + " |", "|---" * (1 + len(keys)) + "|"]
        for c in study:
            row = [f"{c['result'][k]['coverage']:.3f} / {c['result'][k]['power']:.2f}" if k in c["result"] else "–"
                   for k in keys]
            lines.append(f"| {_name(c)}, {c['seeds'][0]} v {c['seeds'][1]} seeds | " + " | ".join(row) + " |")
    lines += ["", "## Every cell", "",
              "Coverage per rule (width relative to the chosen rule's, same test, in brackets).", "",
              "| metric | items | seeds A v B | seed sd A, B | interaction | ρ | simulations | "
              + " | ".join(keys) + " |",
              "|---" * (7 + len(keys)) + "|"]
    for c in cells:
        row = []
        for key in keys:
            if key not in c["result"]:
                row.append("–")
                continue
            x = c["result"][key]
            ref = f"{key.split(': ')[0]}: {chosen['rule']}"
            rel = (f" ({x['width'] / c['result'][ref]['width']:.2f})"
                   if ref in c["result"] and c["result"][ref]["width"] else "")
            row.append(f"{x['coverage']:.3f}{rel}")
        lines.append(f"| {c['metric']} | {c['items']} | {c['seeds'][0]} v {c['seeds'][1]} | "
                     f"{c['sd'][0]:g}, {c['sd'][1]:g}"
                     f"{'' if c['usable'] else ' (single seed varies)'} | {c['interaction']:g} | {c['rho']:g} | "
                     f"{c.get('sims', sims)} | "
                     + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _name(c: dict) -> str:
    return (f"{c['metric']}, {c['items']} items, {c['seeds'][0]} v {c['seeds'][1]} seeds, {c['regime']}, "
            f"interaction {c['interaction']:g}, ρ {c['rho']:g}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000, help="simulations per cell (>= 1000 for the documented map)")
    ap.add_argument("--out", default="results/coverage", help="writes OUT.md and OUT.json")
    ap.add_argument("--recheck", type=int, default=4000,
                    help="simulations added to a cell where a rule near the floor everywhere falls below it (0: none)")
    ap.add_argument("--from-json", action="store_true", help="start from OUT.json's cells instead of simulating them")
    ap.add_argument("--study", default="results/study-cpu",
                    help="the study whose per-item records give the cells of its own regimes")
    ns = ap.parse_args(argv)
    start, cells = time.monotonic(), grid() + study_cells(Path(ns.study))
    if ns.from_json:  # the cells simulated already keep their results; new ones are simulated now
        done = json.loads(Path(ns.out).with_suffix(".json").read_text())
        for cell in done["cells"]:
            cell.setdefault("sims", done["sims"])
        kept = {_key(c): c for c in done["cells"]}
        cells = [kept.get(_key(c), c) for c in cells]
    fresh = set()
    for k, cell in enumerate(cells):
        if "result" in cell:
            continue
        fresh.add(k)
        cell["sims"] = ns.sims
        cell["result"] = cell_coverage(cell["metric"], cell["items"], cell["seeds"], cell["sd"], cell["interaction"],
                                       cell["rho"], ns.sims, seed=k, beta=cell.get("beta"))
        print(f"[coverage] {k + 1}/{len(cells)} {_name(cell)}: " + ", ".join(
            f"{key.split(': ')[0][:4]}/{key.split(': ')[1]} {x['coverage']:.3f}" for key, x in cell["result"].items()),
            file=sys.stderr, flush=True)
    if ns.recheck:  # a cell read back from OUT.json was rechecked when it was simulated
        recheck(cells, ns.recheck, only=fresh if ns.from_json else None)
    chosen = choose(cells)
    out = Path(ns.out)
    out.with_suffix(".json").write_text(json.dumps({"sims": ns.sims, "chosen": chosen, "cells": cells}, indent=1))
    out.with_suffix(".md").write_text(render(cells, chosen, ns.sims, time.monotonic() - start,
                                             " ".join(sys.argv[1:] if argv is None else argv)))
    print(f"chosen: {chosen['rule']} (qualify: {chosen['qualify']}); {len(cells)} cells x {ns.sims} simulations (more "
          f"where rechecked) in {(time.monotonic() - start) / 60:.1f} min; "
          f"{out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
