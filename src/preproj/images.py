"""Images and video for the vision side: MNIST from the local data directory, and Moving MNIST generated from it.

MNIST is `mnist/mnist.npz` in the data directory (../shared/data/README.md §7): uint8 digits, the classic
50k / 10k / 10k split into train, valid and test. Moving MNIST (Srivastava et al. 2015) is not a file: the
generator below and its seed are the data set. Each clip draws its digits from one split's pool only, so a model
trained on clips of train digits is scored on clips whose digits it never saw.

A clip: `digits` digits of 28 x 28 bounce inside a `size` x `size` frame for `frames` frames. Each digit starts at a
uniform position, moves at `speed` pixels per frame in a uniform direction, and reflects off the frame's edges
(position and velocity mirrored, so it never leaves the frame). Frames are composed with the maximum, as the
original set was. The direction class of a clip is the quadrant of its first digit's initial velocity
(0: right-down, 1: left-down, 2: left-up, 3: right-up, in image coordinates): reversing the clip's frames gives
another class in general, so it is a task where frame order matters.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data import DATA_ENV, DataNotFound

MNIST_FILE = "mnist/mnist.npz"
SPLITS = ("train", "valid", "test")
DIGIT = 28


def mnist(split: str, data_dir: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 28, 28), labels uint8 (N,)) of one split: train (50,000), valid (10,000) or test
    (10,000)."""
    if split not in SPLITS:
        raise ValueError(f"MNIST split must be one of {', '.join(SPLITS)}, got {split!r}.")
    if data_dir is None:
        raise DataNotFound(f"MNIST needs {MNIST_FILE} in the data directory: no --data-dir given and ${DATA_ENV} is "
                           "not set; point either at a folder laid out as ../shared/data.")
    path = Path(data_dir) / MNIST_FILE
    if not path.is_file():
        raise DataNotFound(f"MNIST needs {MNIST_FILE} in the data directory: {data_dir} has no such file.")
    with np.load(path, allow_pickle=False) as archive:
        return archive[f"{split}_images"], archive[f"{split}_labels"]


@dataclass(frozen=True)
class Clips:
    """Moving MNIST clips and what made them."""

    frames: np.ndarray
    """uint8 (clips, frames, size, size)."""
    digit_index: np.ndarray
    """int64 (clips, digits): which digits of the split's pool each clip shows."""
    digit_label: np.ndarray
    """uint8 (clips, digits): their labels."""
    velocity: np.ndarray
    """float64 (clips, digits, 2): each digit's initial (row, column) velocity, pixels per frame."""

    @property
    def direction(self) -> np.ndarray:
        """int64 (clips,): the quadrant of the first digit's initial velocity (the order-dependent task)."""
        return direction_class(self.velocity[:, 0])


def direction_class(velocity: np.ndarray) -> np.ndarray:
    """Quadrant of (row, column) velocities: 0 right-down, 1 left-down, 2 left-up, 3 right-up."""
    down, right = velocity[..., 0] >= 0, velocity[..., 1] >= 0
    return np.where(down, np.where(right, 0, 1), np.where(right, 3, 2)).astype(np.int64)


def moving_mnist(images: np.ndarray, labels: np.ndarray, n_clips: int, seed: int | list[int], *, frames: int = 20,
                 size: int = 64, digits: int = 2, speed: float = 3.0) -> Clips:
    """`n_clips` clips drawn from `images` (one split's pool) with numpy's PCG64 seeded by `seed` (an int or a list of
    ints, through numpy's SeedSequence): the same
    arguments give the same bytes (PCG64's stream is the same everywhere; positions are float64, rounded to pixels
    once, so a last-bit difference in a CPU's sin or cos shows only if it lands on a half pixel)."""
    if n_clips < 1 or frames < 1 or digits < 1 or size < DIGIT or not speed > 0:
        raise ValueError(f"moving_mnist needs n_clips, frames, digits >= 1, size >= {DIGIT} and speed > 0; got "
                         f"n_clips={n_clips}, frames={frames}, digits={digits}, size={size}, speed={speed}.")
    rng = np.random.Generator(np.random.PCG64(seed))
    room = size - DIGIT  # the top-left corner stays in [0, room]
    index = rng.integers(0, len(images), size=(n_clips, digits))
    start = rng.uniform(0, room, size=(n_clips, digits, 2))
    angle = rng.uniform(0, 2 * np.pi, size=(n_clips, digits))
    velocity = speed * np.stack([np.sin(angle), np.cos(angle)], axis=-1)
    path = _bounce(start, velocity, frames, room)  # (clips, digits, frames, 2)
    corner = np.rint(path).astype(np.int64)
    out = np.zeros((n_clips, frames, size, size), dtype=np.uint8)
    for c in range(n_clips):
        for d in range(digits):
            digit = images[index[c, d]]
            for t in range(frames):
                r, k = corner[c, d, t]
                window = out[c, t, r:r + DIGIT, k:k + DIGIT]  # a view: composed in place
                np.maximum(window, digit, out=window)
    return Clips(out, index, labels[index], velocity)


def _bounce(start: np.ndarray, velocity: np.ndarray, frames: int, room: float) -> np.ndarray:
    """Positions at each frame of points moving at constant speed inside [0, room], reflected off both ends: the
    unfolded straight path folded back into the interval (a triangle wave of period 2 room)."""
    steps = np.arange(frames, dtype=np.float64)[:, None]  # (frames, 1)
    free = start[..., None, :] + steps * velocity[..., None, :]  # (clips, digits, frames, 2)
    if room == 0:  # a frame the digit's own size: nowhere to move
        return np.zeros_like(free)
    folded = np.mod(free, 2 * room)
    return np.where(folded > room, 2 * room - folded, folded)


CLIP_SEEDS = {"train": 1, "valid": 2, "test": 3}
"""Clip i of a split is moving_mnist(that split's digits, 1, seed=[CLIP_SEEDS[split], i]): the data set is the
generator and these seeds."""


class ClipSet:
    """`n` Moving MNIST clips of one split, generated when indexed (so a set of any size costs no memory), and the
    views a training loop indexes: `view("context")` the first `context` frames, `view("future")` the frames after
    them, `view("clip")` every frame, `view("direction")` the direction class. Two views indexed with the same clips
    in a row generate them once."""

    def __init__(self, split: str, data_dir: Path | None, n: int, *, frames: int, context: int = 0, size: int = 64,
                 digits: int = 2):
        self.images, self.labels = mnist(split, data_dir)
        self.split, self.n, self.frames, self.context, self.size, self.digits = split, n, frames, context, size, digits
        self._last: tuple[tuple[int, ...], Clips] | None = None

    def clips(self, index) -> Clips:
        index = tuple(int(i) for i in np.asarray(index).reshape(-1))
        if self._last is None or self._last[0] != index:
            made = [moving_mnist(self.images, self.labels, 1, [CLIP_SEEDS[self.split], i], frames=self.frames,
                                 size=self.size, digits=self.digits) for i in index]
            self._last = index, Clips(*(np.concatenate([getattr(c, f) for c in made]) for f in
                                        ("frames", "digit_index", "digit_label", "velocity")))
        return self._last[1]

    def first(self, n: int) -> ClipSet:
        """The first n clips (the same clips: clip i depends on i alone), sharing the digits."""
        other = copy.copy(self)
        other.n, other._last = min(n, self.n), None
        return other

    def view(self, part: str) -> ClipView:
        return ClipView(self, part)


@dataclass(frozen=True)
class ClipView:
    clips: ClipSet
    part: str

    def __len__(self) -> int:
        return self.clips.n

    def __getitem__(self, index):
        import torch

        made = self.clips.clips(index)
        c = self.clips.context
        part = {"clip": lambda: made.frames, "context": lambda: made.frames[:, :c],
                "future": lambda: made.frames[:, c:], "direction": lambda: made.direction}[self.part]()
        return torch.from_numpy(np.ascontiguousarray(part))
