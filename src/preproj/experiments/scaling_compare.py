"""The comparisons of a from-scratch grid (`preproj scaling`, a scaling study): each family of the plan, every variant
against its reference, corrected within the family.

Text runs are compared on the test loss, seed by seed (a t interval over the seeds' paired differences). Vision runs
write a file of per-item scores (items.TASK.jsonl), so they are compared item by item and seed by seed, as compare's
methods are (analysis.stats.paired_difference under the plan's rule): on the loss and, for the classifiers, on the
accuracy.
"""

from __future__ import annotations

from pathlib import Path

from ..analysis.pairing import correct, describe_entry, item_values, other_convention, plan_alpha
from ..analysis.stats import RULE, STATISTICS, paired_difference, paired_t
from .scaling_report import distinct

REFERENCE = "preproj+skip"
ITEM_METRICS = (("loss", False), ("acc", True))
"""Per-item fields compared for a vision task (those its files have), and whether higher is better; both are means
over the items (STATISTICS["accuracy"] is the mean)."""


def default_plan(variants: list[str]) -> dict:
    """Every variant against preproj+skip and against the parameter-matched plain model (where it is in the grid),
    seed-paired t on the test loss, Holm within each of the two families."""
    plain = "base@params" if "base@params" in variants else None
    families = [{"name": f"against {REFERENCE}", "correction": "holm", "reference": REFERENCE}]
    if plain:
        families.append({"name": f"against {plain}", "correction": "holm", "reference": plain})
    return {"alpha": 0.05, "test": "seed-paired t on the test loss (validation loss for a text without a test split)",
            "families": families}


def paired_by_plan(sizes: dict, plan: dict) -> list[dict]:
    """Each family's comparisons (every variant of every size against the family's reference), seed-paired t
    intervals with p-values, Holm (or Benjamini-Hochberg) within the family, the verdict from the adjusted p. The
    effect is the variant's loss minus the reference's: negative means the variant is better. A pair an earlier
    family compares is not repeated, and a variant that shares its runs with an earlier one (base@flops at
    base@params's width) is compared once. Each entry also lands in its size's `paired` table."""
    found, compared, alpha = [], set(), plan_alpha(plan)
    rule = plan.get("rule", RULE)
    for family in plan["families"]:
        reference, members, twins, measured = family["reference"], [], [], []
        for key, entry in sizes.items():
            for variant in distinct(entry["variants"]):
                pair = (key, frozenset((variant, reference)))
                if variant == reference or reference not in entry["variants"] or pair in compared:
                    continue
                for p, twin in _compared(entry["variants"][reference], entry["variants"][variant], key,
                                         (rule, other_convention(rule))):
                    compared.add(pair)
                    members.append({"method": variant, "reference": reference, "size": key, **p.to_dict(),
                                    "raw_verdict": p.verdict})
                    twins.append({"method": variant, "reference": reference, **twin.to_dict(),
                                  "raw_verdict": twin.verdict})
                    measured.append(p)
        alone = {"alpha": alpha, "families": [
            {"name": family["name"], "correction": family["correction"], "members": "all"}]}
        correct(members, alone, measured)
        correct(twins, alone)
        for m, twin in zip(members, twins, strict=True):  # a call the other convention would not make is fragile
            m["fragile"] = m["verdict"] != twin["verdict"]
        for m in members:
            if "items" in sizes[m["size"]]["variants"][m["method"]]:  # vision: one entry per metric
                m["text"] = describe_entry(m, alpha)
                sizes[m["size"]]["paired"].setdefault(reference, {}).setdefault(m["method"], {})[m["metric"]] = m
            else:
                m["text"] = describe_entry({**m, "metric": "loss"}, alpha)
                sizes[m["size"]]["paired"].setdefault(reference, {})[m["method"]] = m
        found += members
    return found


def _compared(reference: dict, variant: dict, size: str, rules: tuple[str, ...]) -> list[tuple]:
    """The paired differences of `variant` against `reference` (none until both have every seed), one tuple per
    metric with the difference under each of the interval `rules`. A text grid's seed-paired t takes no rule: the
    same difference stands under every one."""
    if "items" in variant:
        return _item_paired(reference, variant, rules)
    split = "test" if variant["test_loss"] else "validation"  # text files have no separate test text
    a, b = reference[f"{split}_loss"], variant[f"{split}_loss"]
    if not a or len(a) != len(b):
        return []
    return [(paired_t(a, b, metric=f"{size} {split} loss", higher_is_better=False),) * len(rules)]


def _item_paired(reference: dict, variant: dict, rules: tuple[str, ...]) -> list[tuple]:
    """Over the test items and the seeds (seed i: the same initialisation and data order for both), each metric the
    per-item files hold, read once and compared under each rule."""
    task = variant["task"]
    files = [[Path(d) / f"items.{task}.jsonl" for d in side["items"]] for side in (reference, variant)]
    if not files[0] or len(files[0]) != len(files[1]):
        return []
    found = []
    for field, higher in ITEM_METRICS:
        try:
            a, b = (item_values(f, task, lambda x, k=field: x[k]) for f in files)
        except KeyError:  # next-frame prediction scores no accuracy
            continue
        if a is not None and b is not None and a.shape == b.shape:
            found.append(tuple(paired_difference(a, b, STATISTICS["accuracy"], metric=f"{task}.{field}",
                                                 higher_is_better=higher, seed_paired=len(a) > 1, rule=rule)
                               for rule in rules))
    return found
