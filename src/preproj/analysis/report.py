"""compare's report.md, written from results.json's contents: the methods table, the analysis plan's question,
learning rates, paired differences, the paper's claims and what agrees with the paper."""

from __future__ import annotations

import json

import numpy as np

from ..evaluation.tasks import Metric, columns
from ..runtime.provenance import describe
from .pairing import (
    detectable_text,
    digits,
    family_sizes,
    inside_margin,
    interval_text,
    other_convention,
    plan_alpha,
    verdict_in,
)
from .paper import PAPER_COLUMNS, PAPER_TABLE, claims_table
from .stats import RULE, p_text


def mean_known(seconds: list[float | None]) -> dict:
    """The mean over the runs whose time is on record, and how many of them there are."""
    known = [x for x in seconds if x is not None]
    return {"mean": float(np.mean(known)) if known else None, "runs": len(known), "of": len(seconds)}


def _fmt_seconds(t: dict) -> str:
    if t["mean"] is None:
        return "unknown"
    return f"{t['mean']:.0f}s" + (f" ({t['runs']} of {t['of']} runs)" if t["runs"] < t["of"] else "")


def _fmt_training(report: dict) -> str:
    """The shared training arguments; a swept learning rate is each method's own, so the default is not shown."""
    if not report.get("sweep"):
        return json.dumps(report["train"])
    return json.dumps({k: v for k, v in report["train"].items() if k != "lr"}) + " at each method's swept learning rate"


def _fmt_seeds(report: dict) -> str:
    """One count when every trained method has the same seeds, else each method's seeds (an interim report, or
    `--seeded-methods` giving some methods more seeds than others)."""
    trained = {m: row["seeds"] for m, row in report["methods"].items() if row["trainable_params"]}
    if len({tuple(s) for s in trained.values()}) <= 1:
        return f"Seeds per method: {report['seeds']}"
    return "Seeds: " + "; ".join(f"{m} {', '.join(map(str, s))}" for m, s in trained.items())


def _fmt(cell: dict, metric: Metric) -> str:
    ppl = metric.statistic == "perplexity"  # perplexities in two decimals, the rest in three
    value = f"{cell['mean']:.2f}" if ppl else f"{cell['mean']:.3f}"
    if cell["ci95"] is None:
        return value
    return value + (f" ± {cell['ci95']:.2f}" if ppl else f" ± {cell['ci95']:.3f}")


def scored_columns(report: dict) -> list[tuple[str, Metric]]:
    """The table's columns that every method was scored on (a study may score some tasks only)."""
    rows = report["methods"].values()
    return [(t, m) for t, m in columns(report["protocol"]) if all(f"{t}.{m.name}" in r["metrics"] for r in rows)]


def _fmt_precisions(report: dict) -> str:
    arms = report.get("arms") or {}
    said = (f"Precision, the same for every method{' but the named arms' if arms else ''}: training "
            f"{report.get('precision', '?')}, evaluation {report.get('eval_precision', '?')}.")
    return said + "".join(f" {name}: {a['method']}, training {a['precision']}, evaluation {a['eval_precision']}."
                          for name, a in arms.items())


def render_report(report: dict) -> str:
    protocol, cols = report["protocol"], scored_columns(report)
    pending = report.get("pending")
    interim = [f"**Interim report**: {len(pending)} run(s) still to come ({', '.join(pending)}); every figure below is "
               "from the runs finished so far.", ""] if pending else []
    lines = [f"# preproj compare: {report['model']} (preset {report['preset']})", "", *interim,
             f"Protocol `{protocol}`; evaluation items per task: "
             + (", ".join(f"{k} {v}" for k, v in report["eval_limits"].items()) or "the protocol's defaults")
             + f". Training: {_fmt_training(report)}. {_fmt_precisions(report)} {_fmt_seeds(report)}. "
             "Intervals are 95%: over seeds when there are several, else 1.96 x the metric's standard error, which "
             "carries no seed-to-seed variation (a row with one trained seed is conditional on it).", "",
             "| method | seeds | lr | trainable params | " + " | ".join(m.header for _, m in cols)
             + " | train tokens | train time | eval time |",
             "|---" * (len(cols) + 7) + "|"]
    for method, row in report["methods"].items():
        cells = [_fmt(row["metrics"][f"{t}.{m.name}"], m) for t, m in cols]
        trained = bool(row["trainable_params"])
        params = f"{row['trainable_params'] / 1e6:.2f}M" if trained else "–"
        train_time = _fmt_seconds(row["train_seconds"]) if trained else "–"
        lr = f"{row['lr']:g}" if row.get("lr") else "–"
        lines.append(f"| {method} | {len(row['seeds'])} | {lr} | {params} | " + " | ".join(cells)
                     + f" | {row['train_tokens']:,} | {train_time} | {_fmt_seconds(row['eval_seconds'])} |")
    lines += question_section(report)
    lines += ["", "The paper's Table 2 (Pythia, its own protocol on 500-item subsets, one seed), for reference:", "",
              "| model | method | params | LAMBADA | HellaSwag | ARC-E | PPL |", "|---|---|---|---|---|---|---|"]
    for model, rows in PAPER_TABLE.items():
        for method, (p, lam, hs, arc, ppl) in rows.items():
            lines.append(f"| {model} | {method} | {'–' if p is None else f'{p / 1e6:.1f}M'} | {lam:.3f} | {hs:.3f} | "
                         f"{arc:.3f} | {ppl} |")
    lines += _sweep_section(report.get("sweep"))
    if report.get("paired"):
        lines += ["", "## Paired differences", "", paired_paragraph(report), ""]
        metrics = list(dict.fromkeys(p["metric"] for p in report["paired"]))
        lines += ["| method | against | seeds, test | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 3) + "|"]
        for key in dict.fromkeys((p["method"], p["reference"]) for p in report["paired"]):
            mine = [p for p in report["paired"] if (p["method"], p["reference"]) == key]
            cells = {p["metric"]: p["text"] for p in mine}
            lines.append(f"| {key[0]} | {key[1]} | {mine[0]['seeds'][1]} v {mine[0]['seeds'][0]}, "
                         f"{mine[0].get('test', '–')} | "
                         + " | ".join(cells.get(m, "–") for m in metrics) + " |")
    if report.get("claims") or report.get("depth"):
        alpha = plan_alpha(report.get("plan"))
        lines += ["", "## The paper's claims", "",
                  "Each claim is one method against one reference, checked by the paired difference above and "
                  "corrected with Holm's method within its family of claims: confirmed when the adjusted p is below "
                  f"{alpha:g} and the effect lies on the paper's side of zero, refuted when it lies on the other side, "
                  "otherwise not detectable at this budget (with the smallest effect the run could have detected after "
                  "the correction). The depth claim uses a t interval over seeds.", ""]
        lines += claims_table(report.get("claims", []), report.get("depth"), digits, alpha)
    lines += ["", "## What agrees and what does not", "", agreement_paragraph(report), ""]
    lines += provenance_section(report)
    return "\n".join(lines)


def provenance_section(report: dict) -> list[str]:
    """What made the runs (each run's record, grouped) and this report. Empty for a report without a record."""
    if "provenance" not in report:
        return []
    made = report.get("runs_provenance") or {}
    lines = ["## Provenance", "", f"This report: {describe(report['provenance'])}.", ""]
    lines += [f"- {len(runs)} run(s) ({', '.join(runs)}): {line}" for line, runs in made.items()]
    return lines + [""]


CORRECTIONS = {"holm": "Holm's method", "benjamini-hochberg": "Benjamini-Hochberg"}


def _question_family(plan: dict) -> dict | None:
    """The plan's family named "question", where the plan declares a question and lists that family's members."""
    family = next((f for f in plan.get("families", []) if f["name"] == "question" and f["members"] != "all"), None)
    return family if plan.get("question") else None


def question_section(report: dict) -> list[str]:
    """The question an analysis plan declares, answered by its family named "question" (question_table). Nothing
    when the plan declares no question or no such family."""
    plan = report.get("plan") or {}
    family = _question_family(plan)
    if family is None:
        return []
    declared = f" ({plan['declared']})" if plan.get("declared") else ""
    amended = ", amended since as its `amended` field says," if plan.get("amended") else ""
    correction = CORRECTIONS.get(family["correction"], family["correction"])
    return ["", "## The question", "",
            f"*{plan['question']}* The analysis plan declares it{declared}{amended} with {len(family['members'])} "
            f"paired comparisons, corrected together by {correction}; each is answered when its adjusted p is below "
            f"{plan_alpha(plan):g} (how the differences are computed: Paired differences, below).", "",
            *question_table(report)]


DIFFERENT = ("better", "worse")  # the verdicts that call a difference; the others: none detected, equivalent, undecided


def question_table(report: dict) -> list[str]:
    """Markdown rows for each member of the plan's question family: the paired difference and the verdict that
    family's correction alone leaves, whichever family decides the entry elsewhere in the report (a member whose runs
    are still to come counts as p = 1 there)."""
    plan = report.get("plan") or {}
    family = _question_family(plan)
    if family is None:
        return []
    alpha = plan_alpha(plan)
    found = {(p["method"], p["reference"], p["metric"]): p for p in report.get("paired", [])}
    lines = ["| comparison | metric | seeds, test | difference [95% interval] | p (adjusted) | answer |",
             "|---|---|---|---|---|---|"]
    for member in family["members"]:
        key = (member["method"], member["reference"], member["metric"])
        name = f"{key[0]} − {key[1]} | {key[2]}"
        entry = found.get(key)
        if entry is None:
            lines.append(f"| {name} | – | not measured yet | – (counted as p = 1) | – |")
            continue
        answer = verdict_in(entry, family["name"], alpha)
        if answer == "no detectable difference":
            answer += f" ({detectable_text(entry, alpha)})"
        elif answer.startswith("undecided"):
            n = entry["equivalence"].get("seeds_to_decide")
            answer += f" ({n} seeds would decide it)" if n else " (more seeds would not decide it on these items)"
        answer += inside_margin(entry, family["name"], alpha)
        if entry.get("fragile") and entry.get("decided_by") == family["name"]:
            answer += ", fragile"
        lines.append(f"| {name} | {entry['seeds'][1]} v {entry['seeds'][0]}, {entry.get('test', '–')} | "
                     f"{interval_text(entry)} | {p_text(entry['p'], alpha)} "
                     f"({p_text(entry['adjusted'][family['name']], alpha)}) | {answer} |")
    return lines


def _sweep_section(sweep: dict | None) -> list[str]:
    """The learning-rate sweep: each method's held-out loss at each candidate rate, and the finalists' seeds."""
    if not sweep:
        return []
    lrs = [f"{lr:g}" for lr in sweep["candidates"]]
    lines = ["", "## Learning rates", "", f"Each method's peak learning rate is the candidate with the lowest "
              f"held-out loss after {sweep['steps']} steps (seed 42) on the training data's validation text, which "
              f"is neither training text nor reported (sweep trained in {', '.join(sweep.get('precisions', []))}):", "",
              "| method | " + " | ".join(f"lr {lr}" for lr in lrs) + " | chosen |", "|---" * (len(lrs) + 2) + "|"]
    for method, by_lr in sweep["heldout_loss"].items():
        lines.append(f"| {method} | " + " | ".join(f"{by_lr[lr]:.4f}" for lr in lrs)
                     + f" | {sweep['chosen'][method]:g} |")
    if sweep.get("seeds", 1) > 1:
        lines += ["", f"The best two rates of seed 42 were each trained with {sweep['seeds']} seeds (42, 43, ...); the "
                  "chosen rate has the lower mean held-out loss over them:", "",
                  "| method | rate: held-out loss per seed (mean) |", "|---|---|"]
        for method, finalists in sweep.get("finalists", {}).items():
            lines.append(f"| {method} | " + "; ".join(
                f"{lr}: {', '.join(f'{x:.4f}' for x in xs)} ({np.mean(xs):.4f})"
                for lr, xs in finalists.items()) + " |")
    if sweep.get("common"):
        common = sweep["common"]
        lines += ["", f"The common rate, at which METHOD@common trains, is {common['rate']:g}: the lowest mean over "
                  f"{', '.join(common['methods'])} of each one's mean held-out loss (" + ", ".join(
                      f"lr {lr}: {loss:.4f}" for lr, loss in common["mean_heldout_loss"].items()) + "). Where it is a "
                  "method's own rate, METHOD@common and METHOD are the same runs."]
    return lines


def _family_size(family: dict, size: tuple[int, int] | None) -> str:
    """'19 declared comparisons, 3 of them not measured yet and counted as p = 1' (size: pairing.family_sizes), or
    what the plan leaves open."""
    if size is None:
        return "every comparison" if family["members"] == "all" else f"{len(family['members'])} declared comparisons"
    declared, unmeasured = size
    text = f"{declared} declared comparisons"
    if unmeasured:
        text += f", {unmeasured} of them not measured yet and counted as p = 1"
    return text


def paired_paragraph(report: dict) -> str:
    """How to read the table, then what it says, written from the adjusted verdicts."""
    paired, plan = report["paired"], report.get("plan") or {}
    sizes = family_sizes(plan, paired)
    families = "; ".join(f"{f['name']}: {f['correction']} over {_family_size(f, sizes.get(f['name']))}"
                         for f in plan.get("families", []))
    how = ("Each cell is the paired difference (method minus the reference; for perplexity and held-out loss, lower is "
           "better) with its 95% interval and p-value. The items' variance is computed from the items in closed form "
           "(for WikiText's documents, the jackknife over documents, with their effective number for degrees of "
           "freedom); "
           "seeds enter seed by seed where both arms were trained with the same seeds (seed-paired: seed i is the same "
           "data order), else through each arm's own seed variance (item-and-seed; an arm with one seed adds none, so "
           "the interval is conditional on it). The two parts combine by the rule results/coverage.md chose "
           f"({plan.get('rule', RULE)}). "
           f"Every verdict follows the p-value adjusted for the comparisons of its family ({families}"
           + (f", declared in {plan['file']}" if plan.get("file") else "") + "): better or worse only when the "
           f"adjusted p is below {plan_alpha(plan):g}; otherwise the cell gives the smallest effect this run "
           "could have detected with 80% power at the level its family's correction asks of it, the family's other "
           "p-values as they are (Holm's next step or Benjamini-Hochberg's; alpha over the family's size when nothing "
           "else is called; 'after correction' where that is below alpha). A call marked fragile changes, after "
           "correction, under the "
           f"other defensible convention for the seeds' variance ({other_convention(plan.get('rule', RULE))}).")
    called = [p for p in paired if p["verdict"] in DIFFERENT]
    if not called:
        said = (f" After correction no method differs detectably from its reference on any of the {len(paired)} "
                "comparisons.")
    else:
        said = " Detectable after correction: " + "; ".join(
            f"{p['method']} vs {p['reference']} on {p['metric']}: {p['verdict']} ({p['text'].split(' p ')[0]}"
            + inside_margin(p, p.get("decided_by"), plan_alpha(plan)) + (", fragile" if p.get("fragile") else "")
            + ")" for p in called) + "."
        rest = [p for p in paired if p not in called]
        raw = [p for p in rest if p.get("raw_verdict", p["verdict"]) in DIFFERENT]
        if rest:
            said += f" The other {len(rest)} comparisons show no detectable difference after correction"
            said += (f", {len(raw)} of them only because of it (raw interval excludes zero: "
                     + "; ".join(f"{p['method']} vs {p['reference']} on {p['metric']}" for p in raw) + ")."
                     if raw else ".")
    equivalent = [p for p in paired if p["verdict"].startswith("equivalent")]
    if any("equivalence" in p for p in paired):  # a plan with margins: sameness is tested, not read from a null
        said += (" Equivalence (two one-sided tests within the plan's margins, corrected in the same families): "
                 + ("; ".join(f"{p['method']} vs {p['reference']} on {p['metric']}: {p['verdict']}"
                              for p in equivalent) if equivalent else "no comparison is shown equivalent")
                 + f"; {sum(p['verdict'].startswith('undecided') for p in paired)} undecided.")
    return how + said


def agreement_paragraph(report: dict) -> str:
    """One paragraph, written from the numbers: the sign of each method's change over base, against the paper's 160M."""
    rows = report["methods"]
    if "base" not in rows:
        return "No base row was run, so no change over the base model can be compared with the paper."
    paper = PAPER_TABLE["Pythia-160M"]
    said = []
    for method in [m for m in rows if m != "base" and m in paper]:
        parts = []
        for task, metric in scored_columns(report):
            if task not in PAPER_COLUMNS:
                continue
            k = 1 + PAPER_COLUMNS.index(task)
            ours = rows[method]["metrics"][f"{task}.{metric.name}"]
            base = rows["base"]["metrics"][f"{task}.{metric.name}"]
            delta = ours["mean"] - base["mean"]
            theirs = paper[method][k] - paper["base"][k]
            sign = 1 if metric.higher_is_better else -1
            better, paper_better = sign * delta > 0, sign * theirs > 0
            # The paired test on the same items decides whether the change is real; without one (runs from before
            # per-item records), the wider of the two unpaired intervals does.
            paired = next((p for p in report.get("paired", []) if (p["method"], p["reference"], p["metric"])
                           == (method, "base", f"{task}.{metric.name}")), None)
            if paired is not None:
                real = paired["verdict"] in DIFFERENT
            else:
                real = abs(delta) > max(ours["ci95"] or 0.0, base["ci95"] or 0.0)
            if delta == 0:
                verdict = "no change"
            elif theirs == 0:
                verdict = "no change in the paper" + ("" if real else "; ours not detectable")
            else:
                verdict = "same direction" if better == paper_better else "opposite direction"
                verdict += "" if real else ", not detectable"
            parts.append(f"{metric.header.split()[0]} {delta:+.3g} (paper {theirs:+.3g}: {verdict})")
        said.append(f"{method}: " + "; ".join(parts) + ".")
    said = "Change over base, ours against the paper's Pythia-160M. " + " ".join(said)
    wikitext = dict(scored_columns(report)).get("wikitext")
    if wikitext is None:
        return said
    ppl_key = "wikitext." + wikitext.name
    ranking = sorted(rows, key=lambda m: rows[m]["metrics"][ppl_key]["mean"])
    return (said + f" Ranked by WikiText perplexity (lower is better): {' < '.join(ranking)}; the paper's "
            "160M ranking is preproj+skip < preproj+lora < lora < preproj < base. Training and the perplexity "
            "evaluation share a source (WikiText), so perplexity gains include in-domain adaptation, as in the paper. "
            "The base model, budget and protocol differ from the paper's, so only directions are comparable, not "
            "magnitudes.")
