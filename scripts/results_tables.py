"""The results pages' tables, written from the committed results JSON, so that the pages cannot drift from it.

    .venv/bin/python scripts/results_tables.py            # rewrites every marked block in docs/results/*.md
    .venv/bin/python scripts/results_tables.py --check    # exits 1 naming each block that differs

A block (in a results page or README's headline table) sits between `<!-- NAME:start -->` and `<!-- NAME:end -->`;
BLOCKS says which page holds it and what writes it. tests/test_docs.py runs the check.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

from preproj.analysis.pairing import plan_alpha
from preproj.analysis.stats import p_text

COLUMNS = [("lambada.acc", "LAMBADA acc"), ("hellaswag.acc_norm", "HellaSwag acc_norm"), ("arc_easy.acc", "ARC-E acc"),
           ("wikitext.word_perplexity", "WikiText-2 test word PPL"),
           ("wikitext.heldout_loss", "held-out loss (nats/token)"),
           ("wikitext_file.heldout_loss", "loss, training text's format")]
SHORT = {"no detectable difference": "not detectable"}


def _digits(metric: str) -> int:
    return 2 if "perplexity" in metric else 3


def _interval(entry: dict) -> str:
    """'+0.058 [+0.038, +0.078]', in the metric's digits."""
    d = _digits(entry["metric"])
    return f"{entry['effect']:+.{d}f} [{entry['low']:+.{d}f}, {entry['high']:+.{d}f}]"


def _adjusted(entry: dict) -> float:
    """The p-value the entry's verdict follows: adjusted within the family that decides it."""
    return entry.get("adjusted", {}).get(entry.get("decided_by"), entry["p"])


def _cell(entry: dict, alpha: float) -> str:
    text = (f"{_interval(entry)}, p {p_text(entry['p'], alpha)} (adj. {p_text(_adjusted(entry), alpha)}): "
            f"{SHORT.get(entry['verdict'], entry['verdict'])}")
    if entry["verdict"] == "no detectable difference":
        text += f" (±{entry['mde']:.{_digits(entry['metric'])}f})"
    return text + (", fragile" if entry.get("fragile") else "")


def paired_table(report: dict) -> str:
    columns = [(m, h) for m, h in COLUMNS if any(e["metric"] == m for e in report["paired"])]
    alpha = plan_alpha(report.get("plan"))
    lines = ["| comparison | seeds, test | " + " | ".join(h for _, h in columns) + " |",
             "|---" * (len(columns) + 2) + "|"]
    for key in dict.fromkeys((e["method"], e["reference"]) for e in report["paired"]):
        mine = {e["metric"]: e for e in report["paired"] if (e["method"], e["reference"]) == key}
        first = next(iter(mine.values()))
        lines.append(f"| {key[0]} − {key[1]} | {first['seeds'][1]} v {first['seeds'][0]}, {first['test']} | "
                     + " | ".join(_cell(mine[m], alpha) if m in mine else "–" for m, _ in columns) + " |")
    return "\n".join(lines)


def claims_table(report: dict) -> str:
    alpha = plan_alpha(report.get("plan"))
    lines = ["| claim | family | effect [95% interval] | p (Holm) | verdict |", "|---|---|---|---|---|"]
    for c in report.get("claims", []):
        lines.append(f"| {c['claim']} | {c['family']} | {c['metric']} {_interval(c)} | {p_text(c['p'], alpha)} "
                     f"({p_text(c['p_adjusted'], alpha)}) | {c['verdict']}" + (", fragile" if c.get("fragile") else "")
                     + " |")
    return "\n".join(lines)


HEADLINE = [("skip", "base", "lambada.acc"), ("preproj+skip", "base", "lambada.acc"),
            ("preproj+skip", "skip", "lambada.acc"),
            ("preproj+skip", "base", "wikitext_file.word_perplexity"),
            ("preproj", "base", "wikitext.word_perplexity"), ("lora", "base", "wikitext.word_perplexity"),
            ("preproj+skip", "lora", "wikitext.heldout_loss")]


def headline(study: Path) -> str:
    """README's short table: the study's comparisons that answer the paper's main questions."""
    report = json.loads((study / "results.json").read_text())
    found = {(e["method"], e["reference"], e["metric"]): e for e in report["paired"]}
    alpha = plan_alpha(report.get("plan"))
    lines = ["| comparison | metric | seeds | difference [95% interval] | adjusted p | verdict |",
             "|---|---|---|---|---|---|"]
    for key in HEADLINE:
        if key not in found:
            continue
        e = found[key]
        lines.append(f"| {key[0]} − {key[1]} | {e['metric']} | {e['seeds'][1]} v {e['seeds'][0]} | {_interval(e)} | "
                     f"{p_text(_adjusted(e), alpha)} | {e['verdict']}"
                     + (", fragile" if e.get("fragile") else "") + " |")
    return "\n".join(lines)


def tables(study: Path) -> str:
    report = json.loads((study / "results.json").read_text())
    if not report.get("claims"):  # an interim report whose runs decide none of the paper's claims yet
        return paired_table(report)
    return paired_table(report) + "\n\n" + claims_table(report)


def scaling_tables(out: Path) -> str:
    """The scaling report's per-size tables and step times, from its results.json (`preproj scaling`'s own
    renderer), one heading level down."""
    from preproj.experiments.scaling_report import report_markdown

    text = report_markdown(json.loads((out / "results.json").read_text()))
    sections = text.split("\n## ")[1:]
    body = "\n## ".join(sections).split("\n![")[0]
    return "### " + body.replace("\n## ", "\n### ").strip()


def runs_table(*outs: Path) -> str:
    """Where a from-scratch study's finished runs were made, per study: the commits, and how many runs each CPU kind
    began (train_config.json) and finished (summary.json); bf16 products round differently on different kinds."""
    def kind(provenance: dict | None) -> str:
        if not provenance or "isa" not in provenance:
            return "not recorded"
        flags = [f for f in provenance["isa"] if "bf16" in f]
        return f"{provenance['cpu']} ({', '.join(flags) or 'no native bf16'})"

    def counted(found: Counter) -> str:
        return "; ".join(f"{k}: {n}" for k, n in sorted(found.items()))

    rows = ["| study | runs | commit | began on | finished on |", "|---|---|---|---|---|"]
    for out in outs:
        commits, began, finished = Counter(), Counter(), Counter()
        for path in sorted(out.rglob("summary.json")):
            summary = json.loads(path.read_text())
            if "loss" not in summary:  # training's own summary: the run has not been scored
                continue
            made = summary.get("provenance", {})
            commits[made.get("git_commit", "")[:12] or "not recorded"] += 1
            began[kind(json.loads((path.parent / "train_config.json").read_text()).get("provenance"))] += 1
            finished[kind(made)] += 1
        rows.append(f"| {out.name} | {commits.total()} | {counted(commits)} | {counted(began)} | {counted(finished)} |")
    return "\n".join(rows)


def bf16_table(out: Path) -> str:
    """The bf16 question from its runs' files: erased updates and held-out loss per precision (summary.json), the
    paper protocol's perplexity, and each precision against the base and fp32 masters against pure bf16, paired
    over rows and seeds under the current interval rule (recomputed from the item files, not read from the
    paired JSON written when the runs finished)."""
    import statistics

    from preproj.analysis.pairing import paired_between
    from preproj.analysis.stats import describe

    runs = {p: sorted(out.glob(f"{p}-seed*")) for p in ("bf16-true", "bf16-frozen")}
    items = {p: {"wikitext": [d / "items.wikitext.jsonl" for d in dirs]} for p, dirs in runs.items()}
    base = {"wikitext": [out / "base-seed42" / "items.wikitext.jsonl"]}
    base_ppl = json.loads((out / "base-seed42" / "result.json").read_text())["tasks"]["wikitext"]["perplexity"]
    lines = ["| precision | seeds | erased: W_up | W_down | W_skip | held-out loss, start → end (mean) "
             f"| paper PPL (mean) | minus the base ({base_ppl:.2f}) |", "|---|---|---|---|---|---|---|---|"]
    for precision, dirs in runs.items():
        summaries = [json.loads((d / "summary.json").read_text()) for d in dirs]
        erased = [s.get("bf16_erased_update_fraction_by_module") for s in summaries]
        cells = []
        for module in ("W_up", "W_down", "W_skip"):
            shares = [100 * e[module] for e in erased if e]
            cells.append(f"{min(shares):.1f}–{max(shares):.1f}%" if shares else "–")
        start = statistics.mean(s["initial_heldout_loss"] for s in summaries)
        end = statistics.mean(s["final_heldout_loss"] for s in summaries)
        ppl = statistics.mean(json.loads((d / "result.json").read_text())["tasks"]["wikitext"]["perplexity"]
                              for d in dirs)
        (against_base,) = paired_between(base, items[precision], "paper")
        lines.append(f"| `{precision}` | {len(dirs)} | {' | '.join(cells)} | {start:.3f} → {end:.3f} | {ppl:.2f} | "
                     f"{describe(against_base, 2)} |")
    (masters,) = paired_between(items["bf16-true"], items["bf16-frozen"], "paper")
    return "\n".join(lines) + f"\n\nfp32 master weights minus pure bf16, paper perplexity: **{describe(masters, 2)}**"


def comparison_table(out: Path) -> str:
    """compare's methods table, as its report renders it from results.json."""
    from preproj.analysis.report import render_report

    blocks = render_report(json.loads((out / "results.json").read_text())).split("\n\n")
    return next(b for b in blocks if b.startswith("| method | seeds"))


BASELINE_ROWS = [  # (task, its label, metrics shown in one cell joined by " / ", their label)
    ("lambada", "LAMBADA (lambada_openai)", ["acc"], "acc"),
    ("lambada", "", ["perplexity"], "perplexity"),
    ("hellaswag", "HellaSwag (validation subset)", ["acc", "acc_norm"], "acc / acc_norm"),
    ("arc_easy", "ARC-Easy (test)", ["acc", "acc_norm"], "acc / acc_norm"),
    ("wikitext", "WikiText-2 test, the harness's text", ["word_perplexity", "byte_perplexity"],
     "word / byte perplexity"),
    ("wikitext_file", "WikiText-2 test, the training file's format", ["word_perplexity", "byte_perplexity"],
     "word / byte perplexity"),
]
DIGITS = {"acc": 4, "acc_norm": 4, "perplexity": 2, "word_perplexity": 2, "byte_perplexity": 3}


def baseline_table(runs: dict[str, Path]) -> str:
    """Base models side by side on the full local sets, from their runs' eval.TASK.json (± one standard error);
    a task a run has not finished shows as –."""
    scored = {name: {path.name[len("eval."):-len(".json")]: json.loads(path.read_text())["result"]
                     for path in run.glob("eval.*.json")} for name, run in runs.items()}

    def cell(results: dict, task: str, metrics: list[str]) -> str:
        if task not in results:
            return "–"
        return " / ".join(f"{results[task][m]:.{DIGITS[m]}f} ± {results[task][m + '_stderr']:.{DIGITS[m]}f}"
                          for m in metrics)

    lines = ["| task | items | metric | " + " | ".join(runs) + " |", "|---" * (len(runs) + 3) + "|"]
    for task, label, metrics, metric_label in BASELINE_ROWS:
        items = next((results[task]["n"] for results in scored.values() if label and task in results), "")
        lines.append(f"| {label} | {items} | {metric_label} | "
                     + " | ".join(cell(results, task, metrics) for results in scored.values()) + " |")
    return "\n".join(lines)


def replication_tables(out: Path) -> str:
    """A compare directory's methods table, paired comparisons and claims, from its results.json (which an interim
    `preproj study report` refreshes as runs finish)."""
    if not (out / "results.json").is_file():
        return "No run has been reported yet."
    report = json.loads((out / "results.json").read_text())
    text = comparison_table(out)
    if report["paired"]:
        text += "\n\n" + tables(out)
    return text


def question_table(out: Path) -> str:
    """The analysis plan's question in a compare directory, answered from its results.json (the report's own rows)."""
    from preproj.analysis.report import question_table as rows

    if not (out / "results.json").is_file():
        return "No run has been reported yet."
    return "\n".join(rows(json.loads((out / "results.json").read_text()))) or "The analysis plan declares no question."


def sweep_table(out: Path) -> str:
    """A compare directory's learning-rate sweep from its finished points (sweep/*/summary.json, each beside the
    train_config.json that names its method, rate and seed): the held-out loss per method and rate, seed 42 first and
    further seeds in brackets, and the rate chosen once sweep.json has it; a point not finished shows as –, so the
    table is current while the sweep runs."""
    points: dict[str, dict[float, dict[int, float]]] = {}
    for summary in sorted((out / "sweep").glob("*/summary.json")):
        config = json.loads((summary.parent / "train_config.json").read_text())
        loss = json.loads(summary.read_text())["final_heldout_loss"]
        points.setdefault(config["method"], {}).setdefault(config["lr"], {})[config["seed"]] = loss
    if not points:
        return "No sweep point has finished yet."
    done = out / "sweep" / "sweep.json"
    chosen = json.loads(done.read_text())["chosen"] if done.is_file() else {}
    rates = sorted({lr for by_lr in points.values() for lr in by_lr})

    def cell(by_seed: dict[int, float] | None) -> str:
        if not by_seed:
            return "–"
        later = [f"{by_seed[s]:.4f}" for s in sorted(by_seed) if s != 42]
        return (f"{by_seed[42]:.4f}" if 42 in by_seed else "–") + (f" ({', '.join(later)})" if later else "")

    lines = ["| method | " + " | ".join(f"{lr:g}" for lr in rates) + " | chosen |", "|---" * (len(rates) + 2) + "|"]
    for method in list(chosen) + sorted(set(points) - set(chosen)):
        rate = f"{chosen[method]:g}" if method in chosen else "–"
        lines.append(f"| {method} | " + " | ".join(cell(points[method].get(lr)) for lr in rates) + f" | {rate} |")
    return "\n".join(lines)


def bench_module(bench: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", bench.parents[1] / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    return run


def bench_profile(bench: Path) -> str:
    """The benchmark's rendering of its profile (benchmarks/run.py --profile) and of the oneDNN kernels it saw."""
    r = json.loads(bench.read_text())
    text = bench_module(bench).format_table({k: r[k] for k in ("profile", "isa") if k in r} | {"targets": {}})
    profile = bench_module(bench).format_profile(r["profile"])
    return text.replace(profile, bench_module(bench).format_profile(r["profile"], r.get("train")))


def bench_table(bench: Path, starts: str) -> str:
    """One table of the benchmark's own rendering (benchmarks/run.format_table) of its committed JSON: the one whose
    header row starts with `starts`."""
    lines = bench_module(bench).format_table(json.loads(bench.read_text())).splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(starts))
    table = [lines[first]]
    for line in lines[first + 1:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return "\n".join(table)


def bench_targets(*benches: Path) -> str:
    """The targets table of several runs of benchmarks/run.py on one machine: each target as the last run that
    checked it measured it (every ratio in it is still measured side by side within that run)."""
    rows = {}
    for bench in benches:
        header, rule, *body = bench_table(bench, "| target |").splitlines()
        rows |= {row.split(" | ")[0]: row for row in body}
    return "\n".join([header, rule, *rows.values()])


ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "results" / "bench.json"
BENCH_EPYC = ROOT / "benchmarks" / "results" / "bench-epyc.json"  # the same command on the AMD EPYC (avx512_bf16)
BENCH_EPYC_TRAIN = ROOT / "benchmarks" / "results" / "bench-epyc-train.json"  # its train section, the default fixed
GENERATE = ROOT / "benchmarks" / "results" / "generate.json"  # `run.py --only generate`: the kernels' share
BLOCKS = {  # page -> {block name: what writes it}
    "docs/results/study-cpu.md": {"study-tables": lambda: tables(ROOT / "results" / "study-cpu")},
    "README.md": {"headline": lambda: headline(ROOT / "results" / "study-cpu")},
    "docs/results/scaling.md": {"scaling-tables": lambda: scaling_tables(ROOT / "results" / "scaling-cpu")},
    "docs/results/variants.md": {"variants-tables": lambda: scaling_tables(ROOT / "results" / "variants-cpu")},
    "docs/results/bf16-question.md": {"bf16-table": lambda: bf16_table(ROOT / "results" / "bf16-question")},
    "docs/results/vision.md": {
        "vision-runs": lambda: runs_table(*(ROOT / "results" / f"vision-{task}" for task in (
            "mnist", "moving-mnist", "moving-mnist-direction"))),
        "vision-mnist-tables": lambda: scaling_tables(ROOT / "results" / "vision-mnist")},
    "docs/results/comparison.md": {"comparison-table": lambda: comparison_table(ROOT / "results" / "compare-cpu")},
    "docs/results/confirmatory.md": {
        "confirmatory-question": lambda: question_table(ROOT / "results" / "confirmatory"),
        "confirmatory-sweep": lambda: sweep_table(ROOT / "results" / "confirmatory"),
        "confirmatory-tables": lambda: replication_tables(ROOT / "results" / "confirmatory")},
    "docs/results/gemma3.md": {
        "gemma3-baseline": lambda: baseline_table({"Gemma 3 270M": ROOT / "results" / "gemma3-cpu" / "base-seed42",
                                                   "SmolLM2-135M": ROOT / "results" / "study-cpu" / "base-seed42"}),
        "gemma3-sweep": lambda: sweep_table(ROOT / "results" / "gemma3-cpu"),
        "gemma3-question": lambda: question_table(ROOT / "results" / "gemma3-cpu"),
        "gemma3-tables": lambda: replication_tables(ROOT / "results" / "gemma3-cpu")},
    "docs/results/benchmarks.md": {name: (lambda starts=starts: bench_table(BENCH, starts)) for name, starts in (
        ("bench-train", "| method | precision"), ("bench-generate", "| dtype"), ("bench-eval", "| task | items"),
        ("bench-targets", "| target |"))} | {
        "bench-profile": lambda: bench_profile(BENCH),
        "bench-generate-kernels": lambda: bench_table(GENERATE, "| dtype"),
        "bench-eval-adapters": lambda: bench_table(BENCH, "| method | adapter"),
        "bench-epyc-train": lambda: bench_table(BENCH_EPYC_TRAIN, "| method | precision"),
        "bench-epyc-generate": lambda: bench_table(BENCH_EPYC_TRAIN, "| dtype"),
        "bench-epyc-generate-first": lambda: bench_table(BENCH_EPYC, "| dtype"),
        "bench-epyc-eval": lambda: bench_table(BENCH_EPYC, "| task | items"),
        "bench-epyc-eval-adapters": lambda: bench_table(BENCH_EPYC, "| method | adapter"),
        "bench-epyc-profile": lambda: bench_profile(BENCH_EPYC),
        "bench-epyc-targets": lambda: bench_targets(BENCH_EPYC, BENCH_EPYC_TRAIN)},
}


def rewritten(page: Path, blocks: dict) -> str:
    text = page.read_text()
    for name, write in blocks.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{page} has no block {name}")
        text = pattern.sub(lambda m: m.group(1) + write().strip() + "\n" + m.group(2), text)
    return text


def stale() -> list[str]:
    """The pages whose blocks differ from what the results JSON gives."""
    return [page for page, blocks in BLOCKS.items() if rewritten(ROOT / page, blocks) != (ROOT / page).read_text()]


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each page that differs")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale()
        print("\n".join(f"{page}: differs from its results JSON" for page in differ)
              or "every results table is current")
        return 1 if differ else 0
    for page, blocks in BLOCKS.items():
        (ROOT / page).write_text(rewritten(ROOT / page, blocks))
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
