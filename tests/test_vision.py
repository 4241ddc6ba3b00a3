"""The vision classifier (preproj.vision): 2-D RoPE as the only position, the modules where they sit in text, the
position-shuffle probe's two cases, and a model that learns MNIST."""

from __future__ import annotations

import pytest
import torch

from preproj.core.attach import attach
from preproj.core.config import PreProjConfig
from preproj.core.modules import PreProjAttention
from preproj.vision import ImageClassifier, VisionShape

SHAPE = VisionShape(layers=2, d_model=64, heads=4)
VARIANTS = ("preproj", "skip", "preproj+skip", "gate", "value-residual", "pre-mlp")


def _model(mode: str | None = None) -> ImageClassifier:
    torch.manual_seed(0)
    model = ImageClassifier(SHAPE).eval()
    if mode:
        attach(model, PreProjConfig(mode=mode))
    return model


@pytest.mark.parametrize("mode", [None, *VARIANTS])
def test_position_enters_only_through_rope_so_a_permutation_that_carries_it_changes_nothing(mode):
    """Patches permuted with their (row, column) positions: the same logits, adapted or not (the modules are
    position-agnostic). Permuted with the positions kept in place (the position-shuffle probe): other logits."""
    model, images = _model(mode), torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    order = torch.randperm(49, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(images)
        carried = model(images, order=order)
        kept = model(images, order=order, keep_positions=True)
    assert torch.allclose(carried, logits, atol=1e-5)
    assert (kept - logits).abs().max() > 1e-5


@pytest.mark.parametrize("mode", VARIANTS)
def test_every_from_scratch_variant_attaches_to_the_vision_block_and_starts_near_the_plain_model(mode):
    plain, adapted = _model(), _model(mode)
    images = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    assert all(isinstance(layer.attention, PreProjAttention) for layer in adapted.encoder.transformer.layers)
    with torch.no_grad():
        before, after = plain(images), adapted(images)
    assert not torch.equal(before, after) and (after - before).abs().max() < 0.1 * before.abs().max()


def test_the_pre_projection_feeds_q_k_and_v_before_rope_from_the_blocks_own_norm():
    model = _model("preproj+skip")
    layer = model.encoder.transformer.layers[0]
    seen = {}
    hooks = [layer.attention_norm.register_forward_hook(lambda m, a, out: seen.setdefault("norm", out)),
             layer.attention.preproj.register_forward_hook(lambda m, a, out: seen.setdefault("tilde", out)),
             layer.attention.preproj.register_forward_pre_hook(lambda m, a: seen.setdefault("into", a[0])),
             layer.attention.base_layer.q_proj.register_forward_pre_hook(lambda m, a: seen.setdefault("q_in", a[0]))]
    with torch.no_grad():
        model(torch.randn(2, 1, 28, 28))
    for h in hooks:
        h.remove()
    assert torch.equal(seen["into"], seen["norm"]) and torch.equal(seen["q_in"], seen["tilde"])


@pytest.mark.parametrize("bad, message", [
    (dict(patch_size=5), "patches of 5 pixels do not tile a 28-pixel image"),
    (dict(d_model=60, heads=4), "must split into 4 heads of a size divisible by 4"),
    (dict(channels=0), "channels must be a positive integer"),
])
def test_a_shape_that_cannot_work_is_refused_in_one_line(bad, message):
    with pytest.raises(ValueError, match=message):
        VisionShape(**bad)


def test_images_of_the_wrong_size_or_channels_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"images must be \(batch, 1, 28, 28\), got \(2, 3, 28, 28\)"):
        _model()(torch.zeros(2, 3, 28, 28))


def test_a_learned_position_replaces_rope_in_the_image_classifier():
    torch.manual_seed(0)
    model = ImageClassifier(VisionShape(layers=2, d_model=64, heads=4, position="learned")).eval()
    images = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    order = torch.randperm(49, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, carried = model(images), model(images, order=order)
        kept = model(images, order=order, keep_positions=True)
        assert torch.allclose(carried, logits, atol=1e-5) and (kept - logits).abs().max() > 1e-5
        model.position.table.zero_()  # no position anywhere: RoPE is off
        assert torch.allclose(model(images, order=order, keep_positions=True), model(images), atol=1e-5)
    with pytest.raises(ValueError, match="position must be one of rope, learned"):
        VisionShape(position="sinusoidal")
