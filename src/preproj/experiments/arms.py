"""The arms of a comparison and the order their runs go in: an arm is a method, at its swept rate, a fixed one
(METHOD@LR) or the sweep's common rate (METHOD@common), trained once per seed. A study file may also name an arm
(`[arms.NAME]`): a method at a rate and in a precision of its own, such as the same method in two precisions."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..methods.registry import METHODS
from ..runtime.precision import Precision
from ..runtime.precision import precision as as_precision

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


@dataclass(frozen=True)
class Arm:
    """One arm: what it trains, at which rate, in which precisions (None: the comparison's)."""

    name: str
    method: str
    lr: float | str | None = None
    """A fixed peak rate, COMMON, or None for the method's swept rate (else the budget's)."""
    precision: str | None = None
    eval_precision: str | None = None


ARM_KEYS = {"method": "the method it trains (base, lora, skip, ...)",
            "lr": "a fixed peak learning rate, or \"common\"; default: the method's swept rate, else the budget's",
            "precision": "its training precision; default: the study's",
            "eval_precision": "its evaluation precision, default: the study's; named here, it may load the base in "
                              "another dtype than training did (the arm's saved adapter is scored on that base)"}


def named_arm(name: str, spec: dict) -> Arm:
    """A study file's [arms.NAME], checked: a name no method or METHOD@LR could be, and the keys of ARM_KEYS."""
    if not isinstance(spec, dict):
        raise ValueError(f"arms.{name} must be a table ([arms.{name}]), got {spec!r}.")
    if name in METHODS or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name):
        raise ValueError(f"arm name {name!r} must differ from every method and use letters, digits and _.+- only "
                         "(it names the runs' directories, NAME-seedN).")
    unknown = sorted(set(spec) - set(ARM_KEYS))
    if unknown or "method" not in spec:
        raise ValueError(f"arms.{name}: " + (f"unknown key(s) {', '.join(unknown)}; " if unknown else "no method; ")
                         + "an arm takes " + "; ".join(f"{k}: {v}" for k, v in ARM_KEYS.items()) + ".")
    lr = spec.get("lr")
    method, rate = arm_method_lr(f"{spec['method']}@{lr}" if lr is not None else str(spec["method"]))
    return Arm(name, method, rate, spec.get("precision"), spec.get("eval_precision"))


def arm(name: str, named: dict[str, Arm] | None = None) -> Arm:
    """The arm `name` denotes: a named arm of the study, else METHOD[@LR]."""
    if named and name in named:
        return named[name]
    return Arm(name, *arm_method_lr(name))


def arm_precisions(a: Arm, precision: Precision, eval_precision: Precision, device) -> tuple[Precision, Precision]:
    """An arm's training and evaluation precisions (its own where it names them), which load the base alike, so that
    the base an arm is scored on is exactly the one it was trained on; unless the arm names its own evaluation
    precision, as a check of the training precision alone does (scored on the base that precision loads)."""
    train_p = as_precision(a.precision, device) if a.precision else precision
    eval_p = as_precision(a.eval_precision, device) if a.eval_precision else eval_precision
    if eval_p.weights != train_p.weights and not a.eval_precision:
        raise ValueError(f"eval precision {eval_p.name} loads weights in {eval_p.weights}, training precision "
                         f"{train_p.name} in {train_p.weights}" + (f" (arm {a.name})" if a.name != a.method else "")
                         + ": pick two that load the base alike.")
    return train_p, eval_p


def named_arms_record(arms: dict[str, tuple[Arm, Precision, Precision]], named: dict | None) -> dict:
    """{'arms': each named arm's method and precisions} for a report, where the study names arms; else nothing."""
    record = {n: {"method": a.method, "precision": p.name, "eval_precision": e.name}
              for n, (a, p, e) in arms.items() if n in (named or {})}
    return {"arms": record} if record else {}
