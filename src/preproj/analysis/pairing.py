"""Paired comparisons from per-item files: which comparisons (the analysis plan), each one's effect, interval
and p-value over items and seeds (analysis.stats), and the verdicts the plan's corrections leave."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

from ..evaluation.tasks import TASK_TABLE, columns, paired_metrics, read_items
from ..runtime.files import kept
from .equivalence import equivalence
from .paper import CLAIMS, claim_pairs
from .stats import RULE, RULES, STATISTICS, Paired, benjamini_hochberg, holm, p_text, paired_difference


def column_names(protocol: str) -> dict[str, str]:
    """task -> the metric of its column in the table (what the paper's claims are checked on)."""
    return {task: metric.name for task, metric in columns(protocol)}


def item_values(files: list[Path], task: str, value_of) -> np.ndarray | None:
    """(seeds, items, ...) values of `task` from per-item files, one file per seed; None when a file lacks the task
    or the seeds were scored on different items."""
    rows = []
    for path in files:
        records = sorted(read_items(path).get(task, []), key=lambda x: x["index"])
        if not records:
            return None
        rows.append(([x["index"] for x in records], [value_of(x) for x in records]))
    if not rows or any(idx != rows[0][0] for idx, _ in rows):
        return None
    return np.array([v for _, v in rows], dtype=np.float64)


def other_convention(rule: str) -> str:
    """The rule's twin under the other defensible convention for a seed variance measured on fixed items: less the
    seed-by-item interaction, or raw (results/coverage.md). A call that changes between the two is fragile."""
    if rule.startswith("subtract, ") and rule.replace("subtract", "raw", 1) in RULES:
        return rule.replace("subtract", "raw", 1)
    if rule.startswith("raw, ") and rule.replace("raw", "subtract", 1) in RULES:
        return rule.replace("raw", "subtract", 1)
    return "raw, n-1 df" if rule.startswith("subtract") else "subtract, Satterthwaite df"


def paired_between(a: dict[str, list[Path]], b: dict[str, list[Path]], protocol: str, seed_paired: bool = False,
                   rule: str = RULE, margins: dict[str, float] | None = None) -> list[Paired]:
    """B against A on every paired metric both have: a and b map task -> per-seed item files (seed-paired: file i of
    both sides has the same seed). A metric with a margin also gets its equivalence test (analysis/equivalence.py)
    as `.equivalence`: the margin, the TOST p and the seeds that would decide."""
    found = []
    for task, metric in paired_metrics(protocol):
        va = item_values(a.get(task, []), task, metric.item_value)
        vb = item_values(b.get(task, []), task, metric.item_value)
        if va is None or vb is None or va.shape[1:] != vb.shape[1:]:
            continue
        pair = seed_paired and len(va) == len(vb) > 1
        found.append(paired_difference(va, vb, STATISTICS[metric.statistic], metric=f"{task}.{metric.name}",
                                       higher_is_better=metric.higher_is_better, seed_paired=pair, rule=rule))
        margin = (margins or {}).get(found[-1].metric)
        if margin is not None:
            with_equivalence(found[-1], functools.partial(equivalence, va, vb, STATISTICS[metric.statistic], margin,
                                                          seed_paired=pair, rule=rule))
    return found


def with_equivalence(paired: Paired, test) -> Paired:
    """`paired` with its equivalence test, `test(alpha=...)` (equivalence() with its data and margin bound), at 0.05,
    and `at_level` giving the seeds that would decide at another level too."""
    mde_at = paired.at_level
    paired.equivalence = test()
    paired.at_level = lambda alpha: {**mde_at(alpha), "seeds_to_decide": test(alpha=alpha)["seeds_to_decide"]}
    return paired


def _items_in(dirs: list[Path]) -> dict[str, list[Path]]:
    """task -> the per-item files that compare's run directories hold for it (DIR/items.TASK.jsonl)."""
    return {t: [d / f"items.{t}.jsonl" for d in dirs if kept(d / f"items.{t}.jsonl")] for t in TASK_TABLE}


def _run_files(out: Path, runs: list[dict], method: str) -> dict[str, list[Path]]:
    mine = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
    return _items_in([out / r.get("run_dir", f"{method}-seed{r['seed']}") for r in mine])


def analysis_plan(out: Path, methods: list[str], protocol: str) -> dict:
    """The comparisons, their families and corrections: OUT/analysis_plan.json where the study declared one before
    its runs, else this default: every trained arm against the base and against lora, the pairs the paper's claims
    need; Holm over the claims, Benjamini-Hochberg over every comparison."""
    path = out / "analysis_plan.json"
    if path.is_file():
        plan = json.loads(path.read_text())
        plan["file"] = str(path)
        return plan
    pairs = [(m, ref) for ref in ("base", "lora") if ref in methods for m in methods if m not in ("base", ref)]
    pairs += [pair for pair in claim_pairs(methods) if pair not in pairs]
    names = column_names(protocol)
    claims = [{"method": c.method, "reference": c.reference, "metric": f"{c.task}.{names[c.task]}"} for c in CLAIMS
              if c.task in names]
    return {"alpha": 0.05, "comparisons": [{"method": m, "reference": r} for m, r in pairs],
            "families": [{"name": "claims", "correction": "holm", "members": claims},
                         {"name": "all", "correction": "benjamini-hochberg", "members": "all"}]}


def paired_comparisons(runs: list[dict], methods: list[str], protocol: str, out: Path,
                       plan: dict | None = None) -> list[dict]:
    """The plan's comparisons (analysis_plan), metric by metric, paired over items and, where both arms were trained
    with the same seeds, seed by seed: effect, 95% interval, p-value, the smallest detectable effect (stats.py), and
    the verdict that the family's correction leaves."""
    plan = plan or analysis_plan(out, methods, protocol)
    pairs = [(c["method"], c["reference"]) for c in plan["comparisons"]
             if {c["method"], c["reference"]} <= set(methods)]
    seeds = {m: sorted(r["seed"] for r in runs if r["method"] == m) for m in methods}
    rule = plan.get("rule", RULE)
    found, twin, measured = [], [], []  # the plan's rule, and the other convention's, each corrected in full
    for method, reference in pairs:
        a, b = _run_files(out, runs, reference), _run_files(out, runs, method)
        for task in a:  # a run from before per-item records has no file: no paired comparison for it
            if len(a[task]) != len(seeds[reference]) or len(b[task]) != len(seeds[method]):
                a[task] = b[task] = []
        seed_paired = "base" not in (method, reference) and seeds[method] == seeds[reference] and len(seeds[method]) > 1
        for entries, r in ((found, rule), (twin, other_convention(rule))):
            for p in paired_between(a, b, protocol, seed_paired, r, plan.get("margins")):
                if not plan.get("metrics") or p.metric in plan["metrics"]:
                    entries.append({"method": method, "reference": reference, **p.to_dict(), "raw_verdict": p.verdict})
                    if entries is found:
                        measured.append(p)
    correct(found, plan, measured)
    correct(twin, plan)
    for entry, other in zip(found, twin, strict=True):
        entry["fragile"] = entry["verdict"] != other["verdict"]
        entry["text"] = describe_entry(entry, plan_alpha(plan))
    return found


def declared_members(plan: dict) -> dict[str, set[tuple[str, str, str]]]:
    """family -> the (method, reference, metric) entries a plan declared in a file commits it to, among the plan's
    comparisons (whether or not their runs have finished): a named list, or for "all" every comparison on every metric
    the plan lists. A default plan (none declared) and an "all" family without declared metrics commit to nothing
    beyond what has been measured."""
    if not plan.get("file"):
        return {}
    pairs, declared = {(c["method"], c["reference"]) for c in plan["comparisons"]}, {}
    for family in plan["families"]:
        if family["members"] != "all":
            declared[family["name"]] = {(x["method"], x["reference"], x["metric"]) for x in family["members"]
                                        if (x["method"], x["reference"]) in pairs}
        elif plan.get("metrics"):
            declared[family["name"]] = {(m, r, metric) for m, r in pairs for metric in plan["metrics"]}
    return declared


def family_sizes(plan: dict, entries: list[dict]) -> dict[str, tuple[int, int]]:
    """family -> (members a plan declared in a file commits it to, how many of them `entries` has not measured yet)."""
    measured = {(e["method"], e["reference"], e["metric"]) for e in entries}
    return {name: (len(members), len(members - measured)) for name, members in declared_members(plan).items()}


def plan_alpha(plan: dict | None) -> float:
    """The significance level a plan declares (0.05 where it declares none, or there is no plan): the verdicts follow
    it, and so does every text that writes a p-value beside them."""
    return (plan or {}).get("alpha", 0.05)


def correct(found: list[dict], plan: dict, measured: list[Paired] | None = None) -> None:
    """Adjusted p-values per family (Holm or Benjamini-Hochberg), and each entry's verdict from its adjusted p: a claim
    follows its Holm family, every other entry Benjamini-Hochberg over all comparisons.

    A declared member not measured yet (its runs are still to come) keeps its place in the family as p = 1, so an
    interim report corrects for the whole declared family: both corrections only lower an adjusted p when a p falls,
    so no call an interim report makes is withdrawn when the rest arrive.

    `measured`, the Paired each entry came from: the smallest detectable effect and the seeds that would decide are
    then those at the level its family's correction asks of the entry, the others' p-values as they are
    (detect_level), recorded as "detect_alpha"."""
    alpha = plan_alpha(plan)
    shape = {}  # family -> (correction, size, the members it calls)
    adjust = {"holm": holm, "benjamini-hochberg": benjamini_hochberg}
    sizes = family_sizes(plan, found)
    for family in plan["families"]:
        if family["correction"] not in adjust:
            raise ValueError(f"{plan.get('file', 'the analysis plan')}: family {family['name']!r} has correction "
                             f"{family['correction']!r}; use one of {', '.join(adjust)}.")
        wanted = None if family["members"] == "all" else {(x["method"], x["reference"], x["metric"])
                                                          for x in family["members"]}
        members = [e for e in found if wanted is None or (e["method"], e["reference"], e["metric"]) in wanted]
        unmeasured = sizes.get(family["name"], (0, 0))[1]
        p_values = [e["p"] for e in members] + [1.0] * unmeasured
        adjusted = adjust[family["correction"]](p_values)
        shape[family["name"]] = (family["correction"], len(p_values), {id(e) for e, q in zip(members, adjusted)
                                                                      if q < alpha})
        for entry, q in zip(members, adjusted):
            entry.setdefault("adjusted", {})[family["name"]] = q
            if family["correction"] == "holm" or "decided_by" not in entry:
                entry["decided_by"] = family["name"]
        # the equivalence tests of the family's members that have a margin, corrected the same way among themselves
        tested = [e for e in members if "equivalence" in e]
        for entry, q in zip(tested, adjust[family["correction"]]([_or_one(e["equivalence"]["p"]) for e in tested]
                                                                 + [1.0] * unmeasured)):
            entry["equivalence"].setdefault("adjusted", {})[family["name"]] = q
    for entry in found:
        entry["verdict"] = verdict_in(entry, entry.get("decided_by"), alpha)
    if measured is None:
        return
    for entry, paired in zip(found, measured, strict=True):
        entry["detect_alpha"] = detect_level(entry, shape.get(entry.get("decided_by")), alpha)
        if paired.at_level is not None:
            figures = paired.at_level(entry["detect_alpha"])
            entry["mde"] = figures["mde"]
            if "seeds_to_decide" in figures:
                entry["equivalence"]["seeds_to_decide"] = figures["seeds_to_decide"]


def detect_level(entry: dict, family: tuple[str, int, set] | None, alpha: float) -> float:
    """The raw p at which `entry` would be called, the rest of its family as it is: Holm's next step, alpha over the
    members not yet called; Benjamini-Hochberg's, alpha times (the others called + 1) over the family's size. With
    nothing else called, both are alpha over the size (Bonferroni)."""
    if family is None:
        return alpha
    correction, size, called = family
    others = len(called - {id(entry)})
    return alpha / (size - others) if correction == "holm" else alpha * (others + 1) / size


def _or_one(p: float) -> float:
    return p if math.isfinite(p) else 1.0


def equivalent_in(entry: dict, family: str | None, alpha: float) -> bool:
    """Whether the entry's equivalence test, adjusted within `family`, puts the difference inside its margin."""
    test = entry.get("equivalence")
    return bool(test) and test.get("adjusted", {}).get(family, _or_one(test["p"])) < alpha


def verdict_in(entry: dict, family: str | None, alpha: float) -> str:
    """The verdict that the entry's p adjusted within `family` leaves (its raw p where that family adjusted none): its
    raw verdict when below alpha, else no detectable difference."""
    q = entry.get("adjusted", {}).get(family, entry["p"])
    if q < alpha:
        return entry["raw_verdict"]
    if "equivalence" not in entry:
        return "no detectable difference"
    margin = f"±{entry['equivalence']['margin']:g}"
    return f"equivalent within {margin}" if equivalent_in(entry, family, alpha) else f"undecided at {margin}"


def inside_margin(entry: dict, family: str | None, alpha: float) -> str:
    """', inside ±m' for a detected difference that the equivalence test also puts inside its margin: real, and too
    small to matter by the plan's own margin; '' otherwise."""
    if "equivalence" in entry and verdict_in(entry, family, alpha) in ("better", "worse") \
            and equivalent_in(entry, family, alpha):
        return f", inside ±{entry['equivalence']['margin']:g}"
    return ""


def interval_text(entry: dict) -> str:
    """'+0.021 [+0.003, +0.040]': the effect and its 95% interval in the metric's digits."""
    f = f"{{:+.{digits(entry['metric'])}f}}"
    return f"{f.format(entry['effect'])} [{f.format(entry['low'])}, {f.format(entry['high'])}]"


def detectable_text(entry: dict, alpha: float = 0.05) -> str:
    """'would detect ±0.030', with 'after correction' where the entry's family asked for a stricter level."""
    corrected = " after correction" if entry.get("detect_alpha", alpha) < alpha else ""
    return f"would detect ±{entry['mde']:.{digits(entry['metric'])}f}{corrected}"


def describe_entry(entry: dict, alpha: float = 0.05) -> str:
    """'+0.021 [+0.003, +0.040] p 0.021, adj. 0.084 (all): no detectable difference (would detect ±0.030)', its
    p-values written on their side of the plan's alpha."""
    d = digits(entry["metric"])
    f = f"{{:+.{d}f}}"
    q = entry.get("adjusted", {}).get(entry.get("decided_by"))
    if not math.isfinite(entry["p"]):  # one item, or no variation at all: nothing to test
        return f"{f.format(entry['effect'])}: no interval ({entry.get('items', '?')} item(s), no variation to test)"
    text = f"{interval_text(entry)} p {p_text(entry['p'], alpha)}"
    if q is not None:
        text += f", adj. {p_text(q, alpha)}"
    text += f": {entry['verdict']}{inside_margin(entry, entry.get('decided_by'), alpha)}"
    if entry["verdict"] == "no detectable difference":
        text += f" ({detectable_text(entry, alpha)})"
    if entry["verdict"].startswith("undecided"):
        n = entry["equivalence"].get("seeds_to_decide")
        text += f" ({n} seeds would decide it)" if n else " (more seeds on these items would not decide it)"
    if entry.get("fragile"):
        text += ", fragile"
    return text


def item_files(spec: str) -> dict[str, list[Path]]:
    """task -> per-seed item files for `preproj paired`: `eval --items` files (comma-separated, one per seed), or
    DIR:METHOD for every seed of METHOD in a `preproj compare` directory (DIR/METHOD-seed*/items.TASK.jsonl)."""
    path, _, method = spec.partition(":")
    if not method:
        paths = [Path(x) for x in path.split(",") if x]
        missing = [str(x) for x in paths if not (x.exists() or kept(x))]
        if missing:
            raise ValueError(f"{', '.join(missing)}: no such file (give items files of preproj eval --items, or "
                             "DIR:METHOD of a compare run).")
        if not paths or not all(kept(x) for x in paths):
            raise ValueError(f"{spec!r}: not items files (preproj eval --items), nor DIR:METHOD of a compare run.")
        files: dict[str, list[Path]] = {}
        for x in paths:
            for task in read_items(x):
                files.setdefault(task, []).append(x)
        return {t: f for t, f in files.items() if len(f) == len(paths)}
    files = _items_in(sorted(Path(path).glob(f"{method}-seed*")))
    if not any(files.values()):
        raise ValueError(f"No per-item records of {method!r} in {path} "
                         f"(expected {path}/{method}-seed*/items.TASK.jsonl).")
    return {t: f for t, f in files.items() if f}


def digits(metric: str) -> int:
    return 2 if "perplexity" in metric else 4 if "loss" in metric else 3
