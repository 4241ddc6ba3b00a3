"""Stopping a run cleanly: SIGINT or SIGTERM ask the loop to stop after the current step, with a checkpoint."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from ..runtime import distributed as ddist


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM stopped the run after a step; a checkpoint of that step is written. The command line
    adds how to continue (it knows the command that was run)."""

    def __init__(self, signum: int, step: int, ckpt: Path):
        self.signal, self.step, self.checkpoint = signum, step, ckpt
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; the checkpoint of that step is "
                         f"in {ckpt}.")


class StopRequests:
    """SIGINT and SIGTERM ask the loop to stop after the current step (a second one stops at once).

    Only the main thread can take signals; elsewhere the loop runs without this."""

    def __init__(self):
        self.signum, self._previous = None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping at once")
        self.signum = signum

    def requested(self) -> int:
        """The signal to stop for, agreed by every process (0: go on)."""
        if not ddist.ranks().enabled:
            return self.signum or 0
        return max(ddist.gather_objects(self.signum or 0))

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
