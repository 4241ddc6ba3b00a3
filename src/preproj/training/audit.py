"""The bf16 question (docs/method.md: what the paper leaves open): how many adapter updates bf16 rounding erased."""

from __future__ import annotations

from collections.abc import Callable

import torch


class Bf16Audit:
    """The fraction of adapter updates that bf16 rounding erased, overall and per module (W_up, W_down, W_skip,
    LoRA A, LoRA B): entries whose gradient was non-zero but whose stored value did not change in the optimizer
    step. `modules` names the kinds, (parameter-name part, label) as the method's registry entry lists them; `local`
    gives this process's part of a (possibly sharded) tensor; `sum` adds over processes."""

    def __init__(self, params: dict[str, torch.Tensor], modules: tuple[tuple[str, str], ...], local: Callable,
                 sum: Callable):
        self.params, self._before, self._local, self._sum = params, {}, local, sum
        self.kind = {n: next((k for key, k in modules if f".{key}." in f".{n}"), "other") for n in params}
        self.counts = {k: [0, 0] for k in dict.fromkeys(self.kind.values())}  # kind -> [erased, moved]

    def before(self) -> None:
        self._before = {n: self._local(p.detach()).clone() for n, p in self.params.items()}

    def after(self) -> None:
        for n, p in self.params.items():
            if p.grad is None:
                continue
            moved = self._local(p.grad) != 0
            self.counts[self.kind[n]][0] += int(((self._local(p.detach()) == self._before[n]) & moved).sum())
            self.counts[self.kind[n]][1] += int(moved.sum())

    def fractions(self) -> tuple[float, dict[str, float]]:
        """(overall fraction, {module kind: fraction}), summed over every process."""
        kinds = list(self.counts)
        flat = self._sum([v for k in kinds for v in self.counts[k]])
        per = {k: flat[2 * i] / max(flat[2 * i + 1], 1) for i, k in enumerate(kinds)}
        return sum(flat[0::2]) / max(sum(flat[1::2]), 1), per
