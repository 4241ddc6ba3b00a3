"""Experiment trackers for training: `--report-to tensorboard,wandb,trackio` (or none, the default).

The JSONL log in the run directory is always written; a tracker gets the same records as they are
made (loss, held-out loss, learning rate, tokens/s, and skip norms by layer). Each tracker's package
is imported only when it is chosen, with a clear message when it is missing.
"""

from __future__ import annotations

from pathlib import Path

TRACKERS = ("none", "tensorboard", "wandb", "trackio")
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def parse_report_to(value: str | None) -> list[str]:
    names = [n.strip() for n in (value or "none").split(",") if n.strip()]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or not names:
        raise ValueError(f"--report-to takes {', '.join(TRACKERS)} (comma-separated), got {value!r}.")
    return [n for n in names if n != "none"]


class Trackers:
    """The chosen trackers, opened on one process (rank 0); log() sends one record to each."""

    def __init__(self, names: list[str], out: Path, config: dict, run_name: str):
        self._sinks = []
        for name in names:
            try:
                self._sinks.append(_open(name, Path(out), config, run_name))
            except ImportError:
                self.close()
                raise ValueError(f"--report-to {name} needs the {PACKAGES[name]} package: pip install "
                                 f"{PACKAGES[name]}") from None

    def log(self, record: dict, step: int) -> None:
        scalars = {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        for sink in self._sinks:
            sink(scalars, step)

    def close(self) -> None:
        for sink in self._sinks:
            getattr(sink, "close", lambda: None)()
        self._sinks = []


def _open(name: str, out: Path, config: dict, run_name: str):
    if name == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(out / "tensorboard"))

        def log(scalars: dict, step: int) -> None:
            for key, value in scalars.items():
                writer.add_scalar(key if "/" in key else f"train/{key}", value, step)
            writer.flush()

        log.close = writer.close
        return log
    if name == "wandb":
        import wandb

        run = wandb.init(project="preproj", name=run_name, config=config, dir=str(out))
        log = lambda scalars, step: run.log(scalars, step=step)  # noqa: E731
        log.close = run.finish
        return log
    import trackio

    trackio.init(project="preproj", name=run_name, config=config)
    log = lambda scalars, step: trackio.log(scalars, step=step)  # noqa: E731
    log.close = trackio.finish
    return log
