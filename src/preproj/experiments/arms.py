"""The arms of a comparison and the order their runs go in: an arm is a method, at its swept rate, a fixed one
(METHOD@LR) or the sweep's common rate (METHOD@common), trained once per seed."""

from __future__ import annotations

import math

from ..methods.registry import METHODS

COMMON = "common"
"""METHOD@common: METHOD at the one rate the sweep finds best on average over the preset's `common_rate_of` methods
(sweep.common_rate), so that two methods are compared at the same rate without a rate picked by hand."""


def arm_method_lr(arm: str) -> tuple[str, float | str | None]:
    """'lora@3e-4' -> ('lora', 0.0003); 'lora@common' -> ('lora', 'common'); 'lora' -> ('lora', None): an arm is a
    method, optionally at a fixed rate or at the sweep's common rate."""
    method, at, lr_text = arm.partition("@")
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}" + (f" in {arm!r}" if arm != method else "")
                         + f"; choose from {', '.join(METHODS)} (METHOD@LR for a fixed learning rate).")
    if not at:
        return method, None
    if lr_text == COMMON and method != "base":
        return method, COMMON
    try:
        lr = float(lr_text)
    except ValueError:
        lr = math.nan
    if method == "base" or not lr > 0 or not math.isfinite(lr):
        raise ValueError(f"{arm!r}: METHOD@LR takes a trained method and a learning rate > 0, such as lora@3e-4.")
    return method, lr


def seed_list(seeds: int | list[int]) -> list[int]:
    """A count of seeds means 42, 43, ...; a list names them (a study's new seeds)."""
    return list(seeds) if isinstance(seeds, list | tuple) else [42 + k for k in range(seeds)]


def run_plan(methods: list[str], seeds: int | list[int], seeded: str) -> list[tuple[str, int]]:
    """(arm, seed) in order: every arm's first seed, then the seeded arms' next, ..., so that a comparison stopped
    part-way already pairs every arm with every other; the unseeded arms (the base) take the first seed only."""
    seeds = seed_list(seeds)
    count = {m: len(seeds) if m in seeded.split(",") and m != "base" else 1 for m in methods}
    return [(m, seeds[k]) for k in range(max(count.values())) for m in methods if k < count[m]]
