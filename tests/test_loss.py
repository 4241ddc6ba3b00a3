"""The fused LM-head cross-entropy equals transformers' own loss and gradients."""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import VOCAB, input_ids, tiny_model

from preproj import PreProjConfig, attach
from preproj.core.loss import body_and_head, causal_lm_loss
from preproj.methods import build_method


def _loss_and_grads(model, fn, autocast: bool):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = fn()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _labels(ids: torch.Tensor) -> torch.Tensor:
    labels = ids.clone()
    labels[0, 7:] = -100  # a padded example
    return labels


@pytest.mark.parametrize("chunk_rows", [5, 256])
def test_equals_transformers_loss_and_gradients_fp32(family, chunk_rows, monkeypatch):
    monkeypatch.setattr("preproj.core.loss.CHUNK_ROWS", chunk_rows)  # 5: many chunks, with a ragged last one
    # eval mode: no dropout, so both runs see the same function
    model = attach(tiny_model(family), PreProjConfig(preproj_init_std=0.2, skip_init_std=0.2))
    ids = input_ids(3, 16)
    labels = _labels(ids)
    ref, ref_grads = _loss_and_grads(model, lambda: model(input_ids=ids, labels=labels).loss, autocast=False)
    ours, our_grads = _loss_and_grads(model, lambda: causal_lm_loss(model, ids, labels), autocast=False)
    # the fused path really ran, except for a head with a bias (GPT-J) or soft-capped logits (Gemma-2), which
    # fall back to the model's own loss
    plain = (model.get_output_embeddings().bias is None
             and getattr(model.config, "final_logit_softcapping", None) is None)
    assert (body_and_head(model) is not None) == plain
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    assert set(our_grads) == set(ref_grads) and len(ref_grads) > 0
    for name, g in ref_grads.items():
        torch.testing.assert_close(our_grads[name], g, rtol=1e-4, atol=1e-7, msg=name)


def test_bf16_autocast_matches_transformers_to_bf16_precision(monkeypatch):
    monkeypatch.setattr("preproj.core.loss.CHUNK_ROWS", 7)
    # eval mode: no dropout, so both runs see the same function
    model = attach(tiny_model("llama"), PreProjConfig(preproj_init_std=0.2, skip_init_std=0.2))
    ids = input_ids(3, 16)
    labels = _labels(ids)
    ref, ref_grads = _loss_and_grads(model, lambda: model(input_ids=ids, labels=labels).loss, autocast=True)
    ours, our_grads = _loss_and_grads(model, lambda: causal_lm_loss(model, ids, labels), autocast=True)
    torch.testing.assert_close(ours, ref, rtol=1e-3, atol=1e-3)
    for name, g in ref_grads.items():
        assert (our_grads[name] - g).norm() <= 0.02 * g.norm(), name


def test_lora_model_uses_fused_path_and_matches():
    model = build_method(tiny_model("gpt_neox"), "lora", lora_rank=4)
    with torch.no_grad():  # LoRA's B starts at zero; make the adapter matter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.1)
    ids = input_ids(2, 12)
    assert body_and_head(model) is not None
    ref, ref_grads = _loss_and_grads(model, lambda: model(input_ids=ids, labels=ids).loss, autocast=False)
    ours, our_grads = _loss_and_grads(model, lambda: causal_lm_loss(model, ids, ids), autocast=False)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    for name, g in ref_grads.items():
        torch.testing.assert_close(our_grads[name], g, rtol=1e-4, atol=1e-7, msg=name)


def test_unknown_family_and_trainable_head_fall_back_to_the_models_own_loss():
    config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
    bloom = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert body_and_head(bloom) is None
    ids = input_ids(2, 10)
    torch.testing.assert_close(causal_lm_loss(bloom, ids, ids), bloom(input_ids=ids, labels=ids).loss)

    full = tiny_model("gpt2").train()  # every weight trainable, the head included
    loss = causal_lm_loss(full, ids, ids)
    loss.backward()
    assert full.get_output_embeddings().weight.grad is not None


def test_all_ignored_labels_is_a_clear_error():
    model = tiny_model("llama")
    ids = input_ids(1, 8)
    with pytest.raises(ValueError, match="-100"):
        causal_lm_loss(model, ids, torch.full_like(ids, -100))
