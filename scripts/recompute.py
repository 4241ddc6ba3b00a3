"""Recompute a compare report's paired numbers from its per-item files alone, without preproj's statistics.

An independent check of `preproj/stats.py` and the corrections in `preproj/compare.py`: this file imports only
numpy and scipy, reads the run directories' items.TASK.jsonl and the report's results.json, and recomputes every
paired entry (the effect, its 95% interval, its p-value, the family-adjusted p-values, the verdict, and the smallest
effect it could detect at the level its family asks of it) from the
method written in results/coverage.md. It prints each disagreement and exits 1 if there is any.

    .venv/bin/python scripts/recompute.py results/study-cpu

A from-scratch grid (`preproj scaling`, a scaling study) writes its comparisons in another layout, one entry per size,
variant and metric, each in one family of its plan; it is read as the same list of paired entries
(`as_compare_layout`) and checked the same way, a vision grid's from its item files, a text grid's from the seeds'
test losses in results.json:

    .venv/bin/python scripts/recompute.py results/vision-mnist
"""

from __future__ import annotations

import json
import lzma
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

# metric -> how one record becomes a value (the same in every task that reports it, both WikiText formats
# included): accuracies are 0/1, perplexities and the held-out loss are (numerator, denominator) pairs of a ratio of
# sums over documents
METRICS = {
    "acc": lambda r: r["acc"],
    "acc_norm": lambda r: r["acc_norm"],
    "word_perplexity": lambda r: (-r["ll"], r["words"]),
    "heldout_loss": lambda r: (-r["ll"], r["tokens"]),
    "loss": lambda r: r["loss"],  # a from-scratch vision run's per-item loss (its accuracy is "acc")
    # the paper's perplexity (WikiText rows): exp of the mean over rows of each row's mean loss per token
    "perplexity": lambda r: (-r["ll"] / r["tokens"], 1.0),
}
EXPONENTIATED = ("word_perplexity", "perplexity")


def _text(path: Path) -> str:
    """A per-item file as written, or its xz copy where the study was packed (scripts/pack_results.py)."""
    if path.is_file():
        return path.read_text(encoding="utf-8")
    with lzma.open(path.with_name(path.name + ".xz"), "rt", encoding="utf-8") as f:
        return f.read()


def load(run_dir: Path, task: str, metric: str) -> np.ndarray:
    rows = [json.loads(line) for line in _text(run_dir / f"items.{task}.jsonl").splitlines()]
    rows = sorted((r for r in rows if r["task"] == task), key=lambda r: r["index"])
    return np.array([METRICS[metric](r) for r in rows], dtype=float)


def metric_and_linearisation(x: np.ndarray, metric: str) -> tuple[float, np.ndarray]:
    """The metric on one seed's items and each item's influence on it (for a ratio over documents, the jackknife's)."""
    if x.ndim == 1:
        return x.mean(), x - x.mean()
    ratio = x[:, 0].sum() / x[:, 1].sum()
    loo = (x[:, 0].sum() - x[:, 0]) / (x[:, 1].sum() - x[:, 1])  # the jackknife over documents
    f = math.exp if metric in EXPONENTIATED else (lambda r: r)
    g = np.exp if metric in EXPONENTIATED else (lambda r: r)
    return f(ratio), (len(x) - 1) * (f(ratio) - g(loo))


def items_df(x: np.ndarray) -> float:
    """Items less one; for documents, their effective number (Kish, by token counts) less one."""
    if x.ndim == 1:
        return len(x) - 1.0
    return float(x[:, 1].sum() ** 2 / (x[:, 1] ** 2).sum()) - 1.0


def seed_term(values: list[float], lins: list[np.ndarray], rule: str) -> tuple[float, float]:
    """(variance of the mean over seeds, degrees of freedom)."""
    n, m = len(values), len(lins[0])
    ms_seeds = np.var(values, ddof=1)
    if rule.startswith("raw"):
        return ms_seeds / n, n - 1
    grid = np.array(lins)
    resid = grid - grid.mean(axis=0)
    dof = (n - 1) * (m - 1)
    ms_inter = (resid ** 2).sum() / dof / m
    comp = ms_seeds - ms_inter
    if comp <= 0:
        return 0.0, math.inf
    if rule != "subtract, Satterthwaite df":
        return comp / n, n - 1
    return comp / n, comp ** 2 / (ms_seeds ** 2 / (n - 1) + ms_inter ** 2 / dof)


def compare(ref: list[np.ndarray], new: list[np.ndarray], metric: str, seed_paired: bool, rule: str) -> dict:
    ref_m = [metric_and_linearisation(x, metric) for x in ref]
    new_m = [metric_and_linearisation(x, metric) for x in new]
    effect = np.mean([v for v, _ in new_m]) - np.mean([v for v, _ in ref_m])
    d = np.mean([u for _, u in new_m], axis=0) - np.mean([u for _, u in ref_m], axis=0)
    var_items = np.var(d, ddof=1) / len(d)
    terms = []
    if seed_paired:
        terms.append(seed_term([b[0] - a[0] for a, b in zip(ref_m, new_m)], [b[1] - a[1] for a, b in zip(ref_m, new_m)],
                               rule))
    else:
        terms += [seed_term([v for v, _ in side], [u for _, u in side], rule) for side in (ref_m, new_m)
                  if len(side) > 1]
    var = var_items + sum(v for v, _ in terms)
    parts = (var_items, max(1.0, items_df(ref[0])), terms)
    if rule.endswith("separate quantiles"):  # items at the normal quantile, each seed term at its own t, in quadrature
        half = _half_widths(parts)
        p = 1.0 if effect == 0 else 0.0
        if var > 0 and effect != 0:
            p = _level(abs(effect), half)
        return {"effect": effect, "low": effect - half(0.05), "high": effect + half(0.05), "p": p, "parts": parts}
    se, df = _se_df(parts, rule)
    q = stats.t.ppf(0.975, df) if math.isfinite(df) else stats.norm.ppf(0.975)
    if se == 0:
        p = 1.0 if effect == 0 else 0.0
    else:
        p = 2 * (stats.t.sf(abs(effect) / se, df) if math.isfinite(df) else stats.norm.sf(abs(effect) / se))
    return {"effect": effect, "low": effect - q * se, "high": effect + q * se, "p": p, "parts": parts}


def seed_t(ref: list[float], new: list[float]) -> dict:
    """compare() for runs scored by one number each, paired by seed: the t interval over the seeds' differences (no
    item term; its seed term carries n-1 degrees of freedom, so every rule builds the same interval)."""
    d = np.asarray(new, dtype=float) - np.asarray(ref, dtype=float)
    effect, se, df = d.mean(), d.std(ddof=1) / math.sqrt(len(d)), len(d) - 1.0
    half = stats.t.ppf(0.975, df) * se
    p = 2 * stats.t.sf(abs(effect) / se, df) if se > 0 else math.nan
    return {"effect": effect, "low": effect - half, "high": effect + half, "p": p, "parts": (0.0, 1.0, [(se * se, df)])}


def _half_widths(parts):
    """The separate-quantiles half-width of the two-sided level-c interval (upper-tail quantiles: exact for tiny c)."""
    var_items, df_items, terms = parts

    def half(c: float) -> float:
        return math.sqrt(stats.t.isf(c / 2, df_items) ** 2 * var_items
                         + sum((stats.t.isf(c / 2, df) if math.isfinite(df) else stats.norm.isf(c / 2)) ** 2 * v
                               for v, df in terms if v > 0))
    return half


def _level(distance: float, half) -> float:
    """The two-sided level at which the interval's half-width equals `distance`, by bisection on log(level)."""
    lo, hi = math.log(1e-16), 0.0
    if half(math.exp(lo)) < distance:
        return math.exp(lo)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if half(math.exp(mid)) >= distance else (lo, mid)
    return math.exp(hi)


def _se_df(parts, rule: str) -> tuple[float, float]:
    var_items, df_items, terms = parts
    var = var_items + sum(v for v, _ in terms)
    share = var_items ** 2 / df_items + sum(v * v / df for v, df in terms if v > 0)
    df = var * var / share if share > 0 else df_items
    if rule == "raw, t(n-1) for all" and terms:
        df = min(df for _, df in terms)
    return math.sqrt(var), df


def one_sided(distance: float, parts, rule: str) -> float:
    """p of 'the difference is at most effect - distance' (a positive distance argues against it), built as the
    interval is."""
    if rule.endswith("separate quantiles"):
        if distance == 0:
            return 0.5
        c = _level(abs(distance), _half_widths(parts))
        return c / 2 if distance > 0 else 1 - c / 2
    se, df = _se_df(parts, rule)
    if se == 0:
        return 0.0 if distance > 0 else 1.0
    return float(stats.t.sf(distance / se, df) if math.isfinite(df) else stats.norm.sf(distance / se))


def tost(m: dict, margin: float, rule: str) -> float:
    """Two one-sided tests that the difference lies within +-margin: the larger p."""
    if not math.isfinite(m["parts"][0]):
        return math.nan
    return max(one_sided(m["effect"] + margin, m["parts"], rule), one_sided(margin - m["effect"], m["parts"], rule))


def holm(p: list[float]) -> list[float]:
    out, worst = [0.0] * len(p), 0.0
    for rank, i in enumerate(sorted(range(len(p)), key=lambda i: p[i])):
        worst = max(worst, min(1.0, (len(p) - rank) * p[i]))
        out[i] = worst
    return out


def bh(p: list[float]) -> list[float]:
    out, best, m = [0.0] * len(p), 1.0, len(p)
    order = sorted(range(m), key=lambda i: p[i], reverse=True)
    for k, i in enumerate(order):
        best = min(best, p[i] * m / (m - k))
        out[i] = best
    return out


RULES = ("subtract, n-1 df", "subtract, Satterthwaite df", "raw, n-1 df", "raw, t(n-1) for all",
         "raw, separate quantiles", "subtract, separate quantiles")


def twin_of(rule: str) -> str:
    """The same rule under the other convention for the seed variance (less the interaction, or raw)."""
    for a, b in (("subtract", "raw"), ("raw", "subtract")):
        if rule.startswith(a + ", ") and rule.replace(a, b, 1) in RULES:
            return rule.replace(a, b, 1)
    return "raw, n-1 df" if rule.startswith("subtract") else "subtract, Satterthwaite df"


def committed_to(plan: dict, family: dict) -> set[tuple[str, str, str]]:
    """The entries a plan declared in a file commits a family to, among its comparisons, finished or not."""
    if not plan.get("file"):
        return set()
    pairs = {(c["method"], c["reference"]) for c in plan["comparisons"]}
    if family["members"] != "all":
        return {(x["method"], x["reference"], x["metric"]) for x in family["members"]
                if (x["method"], x["reference"]) in pairs}
    return {(m, r, metric) for m, r in pairs for metric in plan.get("metrics", [])}


def recomputed(out: Path, report: dict, rule: str) -> list[dict]:
    """Every paired entry of the report under `rule`: effect, interval, p, the p its family decides by, verdict."""
    plan, seeds = report["plan"], {m: row["seeds"] for m, row in report["methods"].items()}
    # an arm's runs: where results.json names them (two arms may share one training), else METHOD-seedN
    dirs = {m: dict(zip(row["seeds"], row.get("run_dirs") or [f"{m}-seed{s}" for s in row["seeds"]]))
            for m, row in report["methods"].items()}
    mine = []
    for entry in report["paired"]:
        if "losses" in report["methods"][entry["method"]]:  # a text grid: one loss per seed, no item files
            mine.append({**seed_t(report["methods"][entry["reference"]]["losses"],
                                  report["methods"][entry["method"]]["losses"]),
                         "higher": entry["higher_is_better"], "family": None})
            continue
        task, metric = entry["metric"].split(".")
        a = [load(out / dirs[entry["reference"]][s], task, metric) for s in sorted(seeds[entry["reference"]])]
        b = [load(out / dirs[entry["method"]][s], task, metric) for s in sorted(seeds[entry["method"]])]
        paired = "base" not in (entry["method"], entry["reference"]) and sorted(seeds[entry["method"]]) == \
            sorted(seeds[entry["reference"]]) and len(seeds[entry["method"]]) > 1
        mine.append({**compare(a, b, metric, paired, rule), "higher": entry["higher_is_better"], "family": None})
        if "equivalence" in entry:
            margin = entry["equivalence"]["margin"]
            mine[-1].update(margin=margin, tost=tost(mine[-1], margin, rule), tost_q={})
    measured = {(e["method"], e["reference"], e["metric"]) for e in report["paired"]}
    alpha, shape = plan.get("alpha", 0.05), {}
    for family in plan["families"]:
        wanted = None if family["members"] == "all" else {(x["method"], x["reference"], x["metric"])
                                                          for x in family["members"]}
        idx = [i for i, e in enumerate(report["paired"])
               if wanted is None or (e["method"], e["reference"], e["metric"]) in wanted]
        missing = [1.0] * len(committed_to(plan, family) - measured)  # declared, runs still to come
        adjust = holm if family["correction"] == "holm" else bh
        adjusted = adjust([mine[i]["p"] for i in idx] + missing)
        shape[family["name"]] = (family["correction"], len(idx) + len(missing),
                                 {i for i, q in zip(idx, adjusted) if q < alpha})
        for i, q in zip(idx, adjusted):
            if family["correction"] == "holm" or mine[i]["family"] is None:
                mine[i]["family"], mine[i]["q"] = family["name"], q
        tested = [i for i in idx if "margin" in mine[i]]  # the equivalence tests, corrected the same way
        for i, q in zip(tested, adjust([_or_one(mine[i]["tost"]) for i in tested] + missing)):
            mine[i]["tost_q"][family["name"]] = q
    for i, m in enumerate(mine):
        m["detect_alpha"] = detect_level(i, shape.get(m["family"]), alpha)
        m["mde"] = detectable(m["parts"], rule, m["detect_alpha"])
    for m in mine:
        m.setdefault("q", m["p"])
        raw = "no detectable difference" if m["low"] <= 0 <= m["high"] else \
            ("better" if (m["effect"] > 0) == m["higher"] else "worse")
        if m["q"] < alpha or "margin" not in m:
            m["verdict"] = raw if m["q"] < alpha else "no detectable difference"
        else:
            q = m["tost_q"].get(m["family"], _or_one(m["tost"]))
            m["verdict"] = f"{'equivalent within' if q < alpha else 'undecided at'} ±{m['margin']:g}"
    return mine


def detect_level(i: int, family, alpha: float) -> float:
    """The raw p at which entry i would be called with the rest of its family as it is: Holm's next step, or
    Benjamini-Hochberg's (alpha over the family's size when nothing else is called)."""
    if family is None:
        return alpha
    correction, size, called = family
    others = len(called - {i})
    return alpha / (size - others) if correction == "holm" else alpha * (others + 1) / size


def detectable(parts, rule: str, c: float) -> float:
    """The smallest effect a two-sided level-c test built as the interval is would detect with 80% power."""
    def q(level: float, df: float) -> float:
        return stats.t.isf(level, df) if math.isfinite(df) else stats.norm.isf(level)

    var_items, df_items, terms = parts
    if rule.endswith("separate quantiles"):
        return math.sqrt((q(c / 2, df_items) + q(0.2, df_items)) ** 2 * var_items
                         + sum((q(c / 2, df) + q(0.2, df)) ** 2 * v for v, df in terms))
    se, df = _se_df(parts, rule)
    return (q(c / 2, df) + q(0.2, df)) * se


def _or_one(p: float) -> float:
    return p if math.isfinite(p) else 1.0


def as_compare_layout(out: Path, results: dict) -> dict:
    """A from-scratch grid's results.json as compare's: an arm per size and variant ("4x128 skip": its seeds and
    run directories), the per-item entries under "paired" with the arms' names, and each family of the plan with
    its members (a grid puts each entry in one family, the one it records as deciding it)."""
    recorded = Path(results["args"]["out"])
    methods = {}
    for size, entry in results["sizes"].items():
        for variant, row in entry["variants"].items():
            if "items" in row:
                methods[f"{size} {variant}"] = {"seeds": list(range(len(row["items"]))), "run_dirs": [
                    str(Path(d).relative_to(recorded)) if not Path(d).is_absolute() else d for d in row["items"]]}
            else:  # a text grid compares the seeds' test losses (validation, for a text without a test split)
                losses = row["test_loss"] or row["validation_loss"]
                methods[f"{size} {variant}"] = {"seeds": list(range(len(losses))), "losses": losses}
    paired = [{**e, "method": f"{e['size']} {e['method']}", "reference": f"{e['size']} {e['reference']}"}
              for e in results["comparisons"] if f"{e['size']} {e['method']}" in methods]
    families = [{"name": f["name"], "correction": f["correction"], "members": [
        {k: e[k] for k in ("method", "reference", "metric")} for e in paired if e["decided_by"] == f["name"]]}
        for f in results["plan"]["families"]]
    rule = results["plan"].get("rule", "raw, separate quantiles")  # a grid's plan names its rule where not the default
    return {"methods": methods, "paired": paired, "plan": {"alpha": results["plan"].get("alpha", 0.05),
                                                           "families": families}, "rule": rule}


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "results/study-cpu")
    report = json.loads((out / "results.json").read_text())
    if "sizes" in report:
        report = as_compare_layout(out, report)
    rule = report["rule"]
    own, twin = recomputed(out, report, rule), recomputed(out, report, twin_of(rule))
    problems = 0
    for entry, m, other in zip(report["paired"], own, twin):
        name = f"{entry['method']} - {entry['reference']} {entry['metric']}"
        checked = ("effect", "low", "high", "p") + (("detect_alpha", "mde") if "detect_alpha" in entry else ())
        for key in checked:  # reports written before the detectable effect took its family's level have none
            if not math.isclose(entry[key], m[key], rel_tol=1e-7, abs_tol=1e-12 if key != "p" else 1e-15):
                problems += 1
                print(f"{name}: {key} {entry[key]!r} in results.json, {m[key]!r} recomputed")
        if "margin" in m:
            test = entry["equivalence"]
            pairs = [("equivalence p", test["p"], m["tost"])] + [
                (f"equivalence p adjusted in {f}", q, m["tost_q"].get(f)) for f, q in test.get("adjusted", {}).items()]
            for what, given, found in pairs:
                if found is None or not (math.isclose(given, found, rel_tol=1e-7, abs_tol=1e-14)
                                         or math.isnan(given) and math.isnan(found)):
                    problems += 1
                    print(f"{name}: {what} {given!r} in results.json, {found!r} recomputed")
        theirs = entry.get("adjusted", {}).get(m["family"], entry["p"])
        if not math.isclose(theirs, m["q"], rel_tol=1e-7, abs_tol=1e-14):
            problems += 1
            print(f"{name}: adjusted p {theirs!r} in results.json, {m['q']!r} recomputed")
        if entry["verdict"] != m["verdict"]:
            problems += 1
            print(f"{name}: verdict {entry['verdict']!r} in results.json, {m['verdict']!r} recomputed")
        if entry.get("fragile") != (m["verdict"] != other["verdict"]):
            problems += 1
            print(f"{name}: fragile {entry.get('fragile')} in results.json; recomputed {m['verdict']} under {rule}, "
                  f"{other['verdict']} under {twin_of(rule)}")
    source = "the per-item files" if any("losses" not in m for m in report["methods"].values()) else \
        "the seeds' losses in results.json"
    print(f"{len(own)} paired entries recomputed from {source} in {out} (rule: {rule}; fragile against "
          f"{twin_of(rule)}): " + ("all agree" if not problems else f"{problems} disagreement(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
