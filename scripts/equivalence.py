"""Decide a declared equivalence: is B within a margin of A on every task's primary metric?

Reads a plan (plan.json with "margins": task -> an absolute margin, or "P% of the ..." for a margin relative to A's
value) and the comparisons `preproj paired A B --out paired.json` wrote. A task's interval (95%, as paired writes
it) must lie inside +-margin; equivalence needs every task (an intersection-union test, so no multiplicity
correction). Writes decision.json beside the plan and prints one line per task.

    python scripts/equivalence.py results/bf16-frozen-check/plan.json results/bf16-frozen-check/paired.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from preproj.evaluation.tasks import TASK_TABLE  # noqa: E402
from preproj.runtime.files import write_json  # noqa: E402


def margin_of(rule: float | str, a: float) -> float:
    """An absolute margin, or 'P% of ...' of A's value."""
    if isinstance(rule, (int, float)):
        return float(rule)
    found = re.match(r"\s*([0-9.]+)%", rule)
    if not found:
        raise ValueError(f"a margin is a number or 'P% of ...', got {rule!r}")
    return float(found.group(1)) / 100 * abs(a)


def decide(plan: dict, paired: list[dict]) -> dict:
    by_metric = {p["metric"]: p for p in paired}
    rows = []
    for task, rule in plan["margins"].items():
        metric = f"{task}.{TASK_TABLE[task].metrics['harness'][0].name}"  # the task's primary metric
        p = by_metric.get(metric)
        if p is None:
            rows.append({"task": task, "metric": metric, "missing": True, "equivalent": False})
            continue
        margin = margin_of(rule, p["a"])
        rows.append({"task": task, "metric": metric, "a": p["a"], "b": p["b"], "effect": p["effect"],
                     "low": p["low"], "high": p["high"], "margin": margin,
                     "equivalent": -margin < p["low"] and p["high"] < margin})
    return {"equivalent": all(r["equivalent"] for r in rows), "tasks": rows,
            "rule": "every task's 95% interval of B - A inside +-margin (intersection-union test)"}


def main(plan_path: str, paired_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    decision = decide(plan, json.loads(Path(paired_path).read_text())["paired"])
    for r in decision["tasks"]:
        if r.get("missing"):
            print(f"{r['metric']:<30} not in {paired_path}")
            continue
        print(f"{r['metric']:<30} A {r['a']:.4f}  B {r['b']:.4f}  B - A {r['effect']:+.4f} "
              f"[{r['low']:+.4f}, {r['high']:+.4f}]  margin ±{r['margin']:.4f}: "
              + ("inside" if r["equivalent"] else "not inside"))
    print("equivalent within the declared margins" if decision["equivalent"]
          else "not shown equivalent within the declared margins")
    write_json(Path(plan_path).with_name("decision.json"), decision)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
