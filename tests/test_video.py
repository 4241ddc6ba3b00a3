"""The video transformer (preproj.vision.video) and Moving MNIST as the loop reads it: 3-D RoPE as the only position,
the modules where they sit in text, both objectives, the clip sets, and bad shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import data_dir

from preproj.core.attach import attach
from preproj.core.config import PreProjConfig
from preproj.core.modules import PreProjAttention
from preproj.images import ClipSet, mnist
from preproj.vision import ClipShape, ClipTransformer
from preproj.vision.video import rope_3d

SHAPES = {"next-frame": ClipShape(objective="next-frame", frames=8, context=4, size=32, tubelet=2, patch_size=8,
                                  layers=2, d_model=24, heads=2),
          "direction": ClipShape(objective="direction", frames=8, size=32, tubelet=2, patch_size=8, layers=2,
                                 d_model=24, heads=2)}
VARIANTS = ("preproj", "skip", "preproj+skip", "gate", "value-residual", "pre-mlp")


def _model(objective: str, mode: str | None = None) -> ClipTransformer:
    torch.manual_seed(0)
    model = ClipTransformer(SHAPES[objective]).eval()
    with torch.no_grad():  # sharper attention than at initialisation, where position barely shows
        for layer in model.encoder.transformer.layers:
            layer.attention.q_proj.weight.mul_(10)
            layer.attention.k_proj.weight.mul_(10)
    if mode:
        attach(model, PreProjConfig(mode=mode))
    return model


def _clips(objective: str, batch: int = 2) -> torch.Tensor:
    s = SHAPES[objective]
    return torch.rand(batch, s.given_frames, s.size, s.size, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("objective", SHAPES)
@pytest.mark.parametrize("mode", [None, "preproj+skip", "value-residual"])
def test_the_given_tokens_permuted_with_their_positions_change_nothing(objective, mode):
    """Position enters only through 3-D RoPE: tubelets permuted with their (time, row, column) positions give the
    same output (the class, or the predicted frames); with the positions kept in place, another."""
    model, clips = _model(objective, mode), _clips(objective)
    given = SHAPES[objective].given_frames // 2 * 16
    order = torch.randperm(given, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out, carried = model(clips), model(clips, order=order)
        kept = model(clips, order=order, keep_positions=True)
        per_clip = model(clips, order=order.expand(2, -1), keep_positions=True)
    assert torch.allclose(carried, out, atol=1e-5)
    assert (kept - out).abs().max() > 1e-4 and torch.allclose(per_clip, kept, atol=1e-6)


def test_rope_3d_makes_attention_scores_depend_on_position_differences_only():
    q, k = torch.randn(24), torch.randn(24)

    def score(p_q, p_k):
        cos, sin = rope_3d(torch.tensor([p_q, p_k]), 24)
        rotated = [v * c + torch.cat([-v[12:], v[:12]]) * s_ for v, c, s_ in zip((q, k), cos, sin, strict=True)]
        return float(rotated[0] @ rotated[1])

    assert score([1, 2, 3], [0, 5, 1]) == pytest.approx(score([4, 0, 7], [3, 3, 5]), abs=1e-5)
    for axis in range(3):  # every axis moves the score: each gets rotated pairs
        moved = [0, 5, 1]
        moved[axis] += 1
        assert abs(score([1, 2, 3], moved) - score([1, 2, 3], [0, 5, 1])) > 1e-4


@pytest.mark.parametrize("mode", VARIANTS)
def test_every_variant_attaches_to_the_video_block_with_the_pre_projection_before_q(mode):
    model = _model("next-frame", mode)
    assert all(isinstance(layer.attention, PreProjAttention) for layer in model.encoder.transformer.layers)
    if "preproj" in mode:
        layer, seen = model.encoder.transformer.layers[0], {}
        hooks = [layer.attention_norm.register_forward_hook(lambda m, a, out: seen.setdefault("norm", out)),
                 layer.attention.preproj.register_forward_pre_hook(lambda m, a: seen.setdefault("into", a[0]))]
        with torch.no_grad():
            model(_clips("next-frame"))
        for h in hooks:
            h.remove()
        assert torch.equal(seen["into"], seen["norm"])


def test_next_frame_predicts_the_frames_after_the_context_and_scores_them_per_pixel():
    model, clips = _model("next-frame"), _clips("next-frame")
    future = torch.randint(0, 256, (2, 4, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        logits = model(clips)
        loss = model(clips, future)
    assert logits.shape == (2, 4, 1, 32, 32)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, future.unsqueeze(2) / 255.0)
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.parametrize("bad, message", [
    (dict(tubelet=3), "tubelets of 3 frames must tile the clip"),
    (dict(context=8), "context 8 must be below frames 8"),
    (dict(patch_size=5), "patches of 5 pixels do not tile a 32-pixel frame"),
    (dict(d_model=20, heads=4), "heads of an even size of at least 6"),
    (dict(objective="colour"), "objective must be one of next-frame, direction"),
])
def test_a_clip_shape_that_cannot_work_is_refused_in_one_line(bad, message):
    from dataclasses import asdict

    with pytest.raises(ValueError, match=message):
        ClipShape(**{**asdict(SHAPES["next-frame"]), **bad})


def test_clips_of_the_wrong_length_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"clips must be \(batch, 4, 1, 32, 32\), got \(2, 6, 1, 32, 32\)"):
        _model("next-frame")(torch.zeros(2, 6, 32, 32))


def test_a_clip_set_makes_the_same_clips_for_an_index_and_keeps_the_splits_apart():
    if data_dir() is None:
        pytest.skip("../shared/data (MNIST) is not here")
    train = ClipSet("train", data_dir(), 100, frames=6, context=4)
    again = ClipSet("train", data_dir(), 100, frames=6, context=4).first(10)
    assert torch.equal(train.view("clip")[[3, 7]], again.view("clip")[[3, 7]])
    clip = train.view("clip")[[5]]
    assert torch.equal(train.view("context")[[5]], clip[:, :4]) and torch.equal(train.view("future")[[5]], clip[:, 4:])
    assert len(again.view("direction")) == 10 and train.view("direction")[[0, 1, 2]].dtype == torch.int64
    test = ClipSet("test", data_dir(), 100, frames=6)
    assert not np.array_equal(test.clips([0]).frames, train.clips([0]).frames)
    assert np.array_equal(test.images, mnist("test", data_dir())[0])  # a test clip's digits come from the test pool


@pytest.mark.parametrize("objective", SHAPES)
def test_a_learned_position_replaces_rope_and_moves_with_a_carried_permutation(objective):
    """position="learned": RoPE is off (with the table zeroed nothing knows where a token is, so even a permutation
    that keeps positions in place changes no class and moves the predicted frames only with the tokens), and a
    permutation that carries positions along changes nothing."""
    from dataclasses import asdict

    torch.manual_seed(0)
    model = ClipTransformer(ClipShape(**{**asdict(SHAPES[objective]), "position": "learned"})).eval()
    with torch.no_grad():  # sharper attention and larger positions than at initialisation, so that position shows
        model.position.table.mul_(50)
        for layer in model.encoder.transformer.layers:
            layer.attention.q_proj.weight.mul_(10)
            layer.attention.k_proj.weight.mul_(10)
    clips, given = _clips(objective), SHAPES[objective].given_frames // 2 * 16
    order = torch.randperm(given, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out, carried = model(clips), model(clips, order=order)
        kept = model(clips, order=order, keep_positions=True)
        assert torch.allclose(carried, out, atol=1e-5) and (kept - out).abs().max() > 1e-4
        model.position.table.zero_()
        blind, blind_kept = model(clips), model(clips, order=order, keep_positions=True)
    if objective == "direction":
        assert torch.allclose(blind_kept, blind, atol=1e-5)
    else:  # the mask tokens are all alike: every predicted tubelet is the same, wherever the context sits
        assert torch.allclose(blind_kept, blind, atol=1e-5) and torch.allclose(blind[:, :2], blind[:, 2:], atol=1e-5)
