"""What each numeric option may be, in one table: checked where the command line parses a flag and
where Python receives an arguments dataclass, with a message that names the flag and its range."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    low: float
    strict: bool = False
    """True: the value must exceed `low`; False: it may equal it."""

    def holds(self, value: float) -> bool:
        return math.isfinite(value) and (value > self.low if self.strict else value >= self.low)

    def describe(self) -> str:
        return f"{'>' if self.strict else '>='} {self.low:g}"


COUNT, POSITIVE_COUNT, NON_NEGATIVE, POSITIVE = Bound(0), Bound(1), Bound(0.0), Bound(0.0, strict=True)

BOUNDS = {
    # training
    "steps": POSITIVE_COUNT, "batch_size": POSITIVE_COUNT, "grad_accum": POSITIVE_COUNT, "seq_len": Bound(2),
    "warmup": COUNT, "eval_every": POSITIVE_COUNT, "eval_batches": POSITIVE_COUNT, "save_every": POSITIVE_COUNT,
    "nproc": POSITIVE_COUNT, "lines": POSITIVE_COUNT, "seed": COUNT,
    "lr": POSITIVE, "weight_decay": NON_NEGATIVE, "max_grad_norm": NON_NEGATIVE,
    # pretraining
    "layers": POSITIVE_COUNT, "d_model": POSITIVE_COUNT, "heads": POSITIVE_COUNT, "kv_heads": POSITIVE_COUNT,
    "intermediate_size": POSITIVE_COUNT, "tokens": POSITIVE_COUNT, "sample_tokens": COUNT,
    "epochs": POSITIVE, "patch_size": POSITIVE_COUNT, "frames": POSITIVE_COUNT,
    "tubelet": POSITIVE_COUNT,
    # evaluation and comparison
    "limit": POSITIVE_COUNT, "max_length": Bound(2), "batch_tokens": POSITIVE_COUNT, "seeds": POSITIVE_COUNT,
    "num_fewshot": COUNT,
    # inspection
    "context": POSITIVE_COUNT, "new_tokens": POSITIVE_COUNT,
}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_value(name: str, value):
    """`value` if the table allows it for option `name` (None always passes: it means the default)."""
    bound = BOUNDS.get(name)
    if bound is not None and value is not None and not bound.holds(value):
        raise ValueError(f"{flag(name)} must be {bound.describe()}, got {value}.")
    return value


def check_args(args) -> None:
    """Check every field of an arguments dataclass that the table bounds."""
    for f in dataclasses.fields(args):
        check_value(f.name, getattr(args, f.name))


def check_within_context(name: str, value: int | None, context: int) -> None:
    if value is not None and value > context:
        raise ValueError(f"{flag(name)} {value} exceeds this model's context of {context} positions; "
                         f"use at most {context}.")
