"""The paper's numbers (docs/method.md: the paper's results, the skip norms by depth) and its claims, each checked
against this project's paired results.

A claim is one method against one reference on one task, in the direction the paper reports. Its verdict
comes from the paired comparison over the same items (and seeds) that `compare` makes, never from the
means alone: confirmed when the 95% interval lies on the paper's side of zero, refuted when it lies on
the other side, and "not detectable at this budget" otherwise, with the smallest effect the run could
have detected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .stats import p_text, t_interval

# Table 2: (trainable params, LAMBADA, HellaSwag, ARC-E, PPL) per method; PAPER_COLUMNS names the tasks of the four
# metric columns
PAPER_COLUMNS = ("lambada", "hellaswag", "arc_easy", "wikitext")
PAPER_TABLE = {
    "Pythia-160M": {"base": (None, 0.128, 0.326, 0.358, 78.4), "preproj": (17.7e6, 0.154, 0.318, 0.342, 73.0),
                    "lora": (26.5e6, 0.126, 0.326, 0.346, 63.8), "preproj+lora": (21.2e6, 0.162, 0.324, 0.352, 60.8),
                    "preproj+skip": (24.8e6, 0.180, 0.338, 0.348, 47.9)},
    "Pythia-410M": {"base": (None, 0.466, 0.396, 0.436, 29.2), "preproj": (62.9e6, 0.470, 0.392, 0.452, 25.1),
                    "lora": (94.4e6, 0.488, 0.400, 0.446, 17.7), "preproj+lora": (72.4e6, 0.470, 0.400, 0.450, 19.2),
                    "preproj+skip": (88.1e6, 0.484, 0.398, 0.432, 17.0)},
}
# Figure 2: ||W_skip||_F per layer after training
PAPER_SKIP_NORMS = {
    "Pythia-160M": [.1295, .1301, .1283, .1274, .1273, .1279, .1315, .1358, .1507, .1905, .2575, .2959],
    "Pythia-410M": [.2017, .1982, .1973, .1958, .1945, .1927, .1887, .1883, .1893, .1888, .1887, .1911, .1928, .1949,
                    .1948, .1983, .2048, .2070, .2117, .2153, .2399, .2573, .2785, .2825],
}


@dataclass(frozen=True)
class Claim:
    text: str
    """The claim, as the paper's Table 2 supports it."""
    method: str
    reference: str
    task: str
    """Compared on this task's table column (the metric depends on the protocol)."""
    paper: str
    """The paper's own figures at Pythia-160M."""


CLAIMS = (
    Claim("pre-projection + skip raises LAMBADA accuracy over the base", "preproj+skip", "base", "lambada",
          "0.128 → 0.180 (+40.6%)"),
    Claim("pre-projection + skip lowers WikiText perplexity below the base's", "preproj+skip", "base", "wikitext",
          "78.4 → 47.9 (−38.9%)"),
    Claim("pre-projection + skip raises HellaSwag over the base", "preproj+skip", "base", "hellaswag", "0.326 → 0.338"),
    Claim("on HellaSwag pre-projection + skip beats LoRA", "preproj+skip", "lora", "hellaswag", "0.338 vs 0.326"),
    Claim("on HellaSwag pre-projection + skip beats pre-projection alone", "preproj+skip", "preproj", "hellaswag",
          "0.338 vs 0.318"),
    Claim("on HellaSwag pre-projection + skip beats pre-projection + LoRA", "preproj+skip", "preproj+lora", "hellaswag",
          "0.338 vs 0.324"),
    Claim("pre-projection + skip beats LoRA on LAMBADA", "preproj+skip", "lora", "lambada",
          "0.180 vs 0.126 (LoRA r=480 with 26.5M parameters; ours is parameter-matched)"),
    Claim("pre-projection + skip beats LoRA on perplexity", "preproj+skip", "lora", "wikitext", "47.9 vs 63.8"),
    Claim("pre-projection alone raises LAMBADA accuracy over the base", "preproj", "base", "lambada", "0.128 → 0.154"),
    Claim("pre-projection alone lowers perplexity below the base's", "preproj", "base", "wikitext", "78.4 → 73.0"),
    Claim("pre-projection + LoRA beats LoRA on LAMBADA", "preproj+lora", "lora", "lambada", "0.126 → 0.162"),
    Claim("pre-projection + LoRA beats LoRA on perplexity", "preproj+lora", "lora", "wikitext", "63.8 → 60.8"),
    # The ablation the paper lacks (docs/method.md: what the paper leaves open): does the pre-projection add
    # anything to the content skip?
    Claim("(ablation, not in the paper) the pre-projection adds to the skip: pre-projection + skip beats skip alone "
          "on LAMBADA", "preproj+skip", "skip", "lambada", "no skip-only run"),
    Claim("(ablation, not in the paper) pre-projection + skip beats skip alone on perplexity", "preproj+skip", "skip",
          "wikitext", "no skip-only run"),
)
DEPTH_CLAIM = ("later layers use the content skip more: ‖W_skip‖ of the last layer over the first's, pre-projection + "
               "skip", ", ".join(f"{v[-1] / v[0]:.1f}× at {m.split('-')[1]}" for m, v in PAPER_SKIP_NORMS.items()))
VERDICTS = {"better": "confirmed", "worse": "refuted", "no detectable difference": "not detectable at this budget"}
UNTESTABLE = "untestable: {items} item(s), an interval needs two or more"


def claim_pairs(methods: list[str]) -> list[tuple[str, str]]:
    """(method, reference) of every claim whose two methods were both run."""
    return list(dict.fromkeys((c.method, c.reference) for c in CLAIMS if {c.method, c.reference} <= set(methods)))


def check_claims(paired: list[dict], plan: dict, columns: dict[str, str]) -> list[dict]:
    """Each claim that a Holm family of the analysis plan holds, with the verdict its adjusted p leaves, from `paired`
    (compare's paired entries) and columns (task -> metric name). A member may compare arms at a fixed rate
    (lora@3e-4): it tests the claim of its methods."""
    found = {(p["method"], p["reference"], p["metric"]): p for p in paired}
    checked = []
    for family in plan["families"]:
        if family["correction"] != "holm" or family["members"] == "all":
            continue
        for member in family["members"]:
            p = found.get((member["method"], member["reference"], member["metric"]))
            task, _, metric = member["metric"].partition(".")
            claim = next((c for c in CLAIMS
                          if (c.method, c.reference) == (_method(member["method"]), _method(member["reference"]))
                          and task in (c.task, f"{c.task}_file") and metric == columns[c.task]), None)
            if p is None or claim is None:
                continue
            arms = ("" if (claim.method, claim.reference) == (p["method"], p["reference"])
                    else f" ({p['method']} vs {p['reference']})")
            text = " (in the training text's format)" if task.endswith("_file") else ""
            # One item (a two-minute look) leaves nothing to estimate a variance from: no interval, no test.
            verdict = VERDICTS.get(p["verdict"], p["verdict"]) if math.isfinite(p["low"]) \
                else UNTESTABLE.format(items=p["items"])
            checked.append({"claim": claim.text + text + arms, "paper": claim.paper, "method": p["method"],
                            "reference": p["reference"], "metric": p["metric"], "verdict": verdict, "items": p["items"],
                            "effect": p["effect"], "low": p["low"], "high": p["high"], "mde": p["mde"],
                            "seeds": list(p["seeds"]), "test": p.get("test"), "p": p.get("p"),
                            "p_adjusted": p.get("adjusted", {}).get(family["name"]), "family": family["name"],
                            "fragile": p.get("fragile", False)})
    return checked


def _method(arm: str) -> str:
    return arm.partition("@")[0]


def check_depth(norms_by_seed: list[list[float]]) -> dict | None:
    """The depth claim from one list of per-layer skip norms per seed: the last-over-first ratio with a t interval
    over seeds (confirmed when it lies above 1, refuted below 1)."""
    if not norms_by_seed:
        return None
    ratios = [n[-1] / n[0] for n in norms_by_seed]
    mean, half = t_interval(ratios)
    if len(ratios) < 2:
        verdict = "not detectable at this budget (one seed, no interval)"
    else:
        verdict = "confirmed" if mean - half > 1 else "refuted" if mean + half < 1 else "not detectable at this budget"
    return {"claim": DEPTH_CLAIM[0], "paper": DEPTH_CLAIM[1], "ratio": mean, "low": mean - half, "high": mean + half,
            "seeds": len(ratios), "verdict": verdict, "per_layer": np.mean(norms_by_seed, axis=0).tolist()}


def claims_table(checked: list[dict], depth: dict | None, digits, alpha: float = 0.05) -> list[str]:
    """Markdown rows: claim, the paper's figures, ours as effect [95% interval], seeds and test, p raw and
    Holm-adjusted within its family (written on their side of the plan's alpha), verdict. digits(metric) -> int."""
    lines = ["| the paper's claim | paper (Pythia-160M) | ours: effect [95% interval] | seeds, test "
             "| p (Holm-adjusted) | verdict |", "|---|---|---|---|---|---|"]
    for c in checked:
        d = digits(c["metric"])
        defined = math.isfinite(c["low"])
        ours = f"{c['metric']} {c['effect']:+.{d}f}" + (f" [{c['low']:+.{d}f}, {c['high']:+.{d}f}]" if defined else "")
        verdict = c["verdict"] + (f" (would detect ±{c['mde']:.{d}f})" if c["verdict"].startswith("not") else "")
        verdict += ", fragile" if c.get("fragile") else ""
        adjusted = ("–" if c.get("p") is None or not defined
                    else f"{p_text(c['p'], alpha)} ({p_text(c['p_adjusted'], alpha)})")
        lines.append(f"| {c['claim']} | {c['paper']} | {ours} | {c['seeds'][1]} v {c['seeds'][0]}, "
                     f"{c.get('test') or '–'} | {adjusted} | {verdict} |")
    if depth:
        interval = "" if depth["seeds"] < 2 else f" [{depth['low']:.2f}, {depth['high']:.2f}]"
        lines.append(f"| {depth['claim']} | {depth['paper']} | {depth['ratio']:.2f}×{interval} | "
                     f"{depth['seeds']} seeds, t | – | {depth['verdict']} |")
    return lines
