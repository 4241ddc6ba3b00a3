"""MNIST from the data directory and Moving MNIST generated from it (issue 55's data): the generator and its seed
are the data set, so its bytes are pinned."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from conftest import data_dir

from preproj.data import DataNotFound
from preproj.images import DIGIT, direction_class, mnist, moving_mnist

# the official counts per class (../shared/data/README.md §7)
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(scope="module")
def test_digits():
    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    return mnist("test", data_dir())


def test_mnist_splits_have_the_documented_sizes_and_counts(test_digits):
    images, labels = test_digits
    assert images.shape == (10000, DIGIT, DIGIT) and images.dtype == np.uint8 and labels.dtype == np.uint8
    assert np.bincount(labels, minlength=10).tolist() == TEST_COUNTS
    assert [len(mnist(split, data_dir())[1]) for split in ("train", "valid")] == [50000, 10000]


def test_mnist_says_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="split must be one of train, valid, test"):
        mnist("training", tmp_path)
    with pytest.raises(DataNotFound, match=r"mnist/mnist.npz in the data directory: .* has no such file"):
        mnist("test", tmp_path)
    with pytest.raises(DataNotFound, match="PREPROJ_DATA_DIR is not set"):
        mnist("test", None)


def test_a_seed_is_a_data_set(test_digits):
    images, labels = test_digits
    clips = moving_mnist(images, labels, 4, seed=1)
    assert clips.frames.shape == (4, 20, 64, 64) and clips.frames.dtype == np.uint8
    # these bytes are the data set: a change to the generator changes every result made on it
    assert hashlib.sha256(clips.frames.tobytes()).hexdigest() == \
        "83dde10893a0f5043f444803540e592ea0d5456ff2c78e589d861b6138a53de3"
    again = moving_mnist(images, labels, 4, seed=1)
    assert np.array_equal(again.frames, clips.frames)
    assert not np.array_equal(moving_mnist(images, labels, 4, seed=2).frames, clips.frames)
    assert np.array_equal(clips.digit_label, labels[clips.digit_index])


def test_digits_bounce_inside_the_frame(test_digits):
    """One fast digit over many frames: every frame holds all of its ink, so it never leaves the frame."""
    images, labels = test_digits
    clips = moving_mnist(images[:1], labels[:1], 30, seed=0, digits=1, frames=40, speed=7.0)
    ink = images[0].astype(np.int64).sum()
    assert (clips.frames.astype(np.int64).sum(axis=(2, 3)) == ink).all()
    assert len({frame.tobytes() for frame in clips.frames[0]}) > 1  # and it moves


def test_digits_are_composed_by_their_maximum():
    """Two full squares in a frame their own size (both at the corner): the brighter wins, nothing adds up."""
    squares = np.stack([np.full((DIGIT, DIGIT), 100, np.uint8), np.full((DIGIT, DIGIT), 200, np.uint8)])
    clips = moving_mnist(squares, np.array([0, 1], np.uint8), 6, seed=0, size=DIGIT, frames=3)
    expected = np.where((clips.digit_index == 1).any(axis=1), 200, 100)
    assert (clips.frames == expected[:, None, None, None]).all()


def test_the_direction_is_the_quadrant_of_the_first_digits_velocity(test_digits):
    velocity = np.array([[1.0, 2.0], [1.0, -2.0], [-1.0, -2.0], [-1.0, 2.0]])  # (row, column)
    assert direction_class(velocity).tolist() == [0, 1, 2, 3]
    # played backwards, a clip starts with the opposite motion, hence the opposite quadrant: the frames as a set are
    # the same, the label is not, so a model blind to frame order has something to lose
    assert (direction_class(-velocity) == (direction_class(velocity) + 2) % 4).all()
    images, labels = test_digits
    counts = np.bincount(moving_mnist(images, labels, 400, seed=4, frames=1).direction, minlength=4)
    assert counts.min() > 60  # the four classes are balanced by construction (uniform angle)


def test_bad_arguments_are_refused_in_one_line(test_digits):
    images, labels = test_digits
    with pytest.raises(ValueError, match="size >= 28"):
        moving_mnist(images, labels, 1, seed=0, size=20)
    with pytest.raises(ValueError, match="speed > 0"):
        moving_mnist(images, labels, 1, seed=0, speed=0)
