"""preproj train on tiny models: outputs, bitwise resume, divergence, LoRA matching, precision audit."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace

import pytest
import torch
from conftest import CharTokenizer, data_dir, tiny_model
from safetensors.torch import load_file

from preproj import load_adapter
from preproj.methods import build_method
from preproj.methods.lora import lora_params_per_rank, matched_lora_rank
from preproj.training import RESUME_MAY_CHANGE, TrainArgs, TrainingDiverged, lr_at, train


@pytest.fixture
def corpus(tmp_path):
    lines = [f"line {i}: the quick brown fox jumps over the lazy dog and keeps running far away {i * 7}"
             for i in range(200)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines))
    return str(path)


def args_for(tmp_path, corpus, **kw) -> TrainArgs:
    base = dict(model="tiny", out=str(tmp_path / "run"), data=corpus, steps=8, batch_size=2, grad_accum=2, seq_len=32,
                lr=1e-2, warmup=2, eval_every=4, eval_batches=2, save_every=3, precision="fp32", device="cpu")
    base.update(kw)
    return TrainArgs(**base)


def test_run_writes_adapter_logs_and_summary(tmp_path, corpus):
    args = args_for(tmp_path, corpus)
    summary, model = train(args, tiny_model("llama"), CharTokenizer(), progress=False)
    out = tmp_path / "run"
    assert {"adapter_config.json", "adapter_model.safetensors", "train_log.jsonl", "summary.json", "train_config.json",
            "checkpoint"} <= {p.name for p in out.iterdir()}
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(9))
    assert [r["step"] for r in log if "heldout_loss" in r] == [0, 4, 8]
    assert summary["tokens_seen"] == 8 * 2 * 2 * 32 and len(summary["skip_norms"]) == 3
    assert summary["final_heldout_loss"] < summary["initial_heldout_loss"]  # it learns
    fresh = load_adapter(tiny_model("llama"), out)
    ids = torch.randint(0, 90, (1, 10))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    with pytest.raises(ValueError, match="already holds a run"):
        train(args, tiny_model("llama"), CharTokenizer(), progress=False)


def test_a_run_records_what_made_it(tmp_path, corpus):
    """The code (version, git commit, whether src/ differed from it), the libraries, the CPU and its instruction sets,
    the threads and the command: in train_config.json (the process that began the run) and summary.json (the one that
    finished it)."""
    import subprocess
    import sys
    from importlib.metadata import version

    from preproj.runtime.provenance import describe

    summary, _ = train(args_for(tmp_path, corpus, steps=2), tiny_model("llama"), CharTokenizer(), progress=False)
    began = json.loads((tmp_path / "run" / "train_config.json").read_text())["provenance"]
    for record in (began, summary["provenance"]):
        assert record["libraries"]["torch"] == version("torch") and record["preproj"] == version("preproj")
        assert record["threads"] == torch.get_num_threads() and record["cpu"] and sys.argv[0] in record["command"]
        assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    if head:  # a checkout: the commit is the one the code came from
        assert began["git_commit"] == head and isinstance(began["git_dirty"], bool)
        assert f"git {head[:7]}" in describe(began)
    assert "threads" in describe(began) and describe(None).startswith("not recorded")
    # check_same_run compares arguments, not records: a resume on another machine is the same run
    train(args_for(tmp_path, corpus, steps=2, resume=True), tiny_model("llama"), CharTokenizer(), progress=False)


@pytest.mark.parametrize("method", ["preproj+skip", "gate", "value-residual", "pre-mlp"])
def test_killed_run_resumes_to_the_same_adapter_bitwise(tmp_path, corpus, method):
    full, _ = train(args_for(tmp_path, corpus, out=str(tmp_path / "full"), method=method), tiny_model("llama"),
                    CharTokenizer(), progress=False)
    reference = load_file(tmp_path / "full" / "adapter_model.safetensors")

    calls = {"n": 0}
    model = tiny_model("llama")
    body = model.model  # training runs the body and a fused LM-head loss
    forward = body.forward

    def killed_forward(*a, **k):
        calls["n"] += 1
        # structure check, held-out (2), 6 steps x 2 micro, held-out at 4, step 7
        if calls["n"] == 1 + 2 + 2 * 6 + 2 + 1:
            raise KeyboardInterrupt("killed")
        return forward(*a, **k)

    body.forward = killed_forward
    with pytest.raises(KeyboardInterrupt):
        train(args_for(tmp_path, corpus, out=str(tmp_path / "killed"), method=method), model, CharTokenizer(),
              progress=False)
    state = torch.load(tmp_path / "killed" / "checkpoint" / "state.pt", weights_only=True)
    assert state["step"] == 6  # the last checkpoint before the kill (save_every=3)
    shutil.copytree(tmp_path / "killed", tmp_path / "old")  # as if written before the log kept training times
    old_log = [{k: v for k, v in x.items() if k != "seconds"} for x in json.loads(state["log_tail"])]
    torch.save({**state, "log_tail": json.dumps(old_log)}, tmp_path / "old" / "checkpoint" / "state.pt")
    resumed, _ = train(args_for(tmp_path, corpus, out=str(tmp_path / "killed"), resume=True, method=method),
                       tiny_model("llama"), CharTokenizer(), progress=False)
    result = load_file(tmp_path / "killed" / "adapter_model.safetensors")
    assert set(result) == set(reference) and all(torch.equal(result[k], reference[k]) for k in reference)
    assert resumed["final_heldout_loss"] == full["final_heldout_loss"]
    log = [json.loads(line) for line in (tmp_path / "killed" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(9))
    # the training time carries over the resume: the steps before the kill count, and it only grows
    seconds = [r["seconds"] for r in log[1:]]
    assert seconds == sorted(seconds) and seconds[5] == json.loads(state["log_tail"])[-1]["seconds"] > 0
    assert resumed["train_seconds"] == seconds[-1] > seconds[5]
    unknown, _ = train(args_for(tmp_path, corpus, out=str(tmp_path / "old"), resume=True, method=method),
                       tiny_model("llama"), CharTokenizer(), progress=False)
    assert unknown["train_seconds"] is None and unknown["final_heldout_loss"] == full["final_heldout_loss"]


def test_a_resume_with_other_arguments_is_refused_and_train_config_is_written_once(tmp_path, corpus):
    args = args_for(tmp_path, corpus, steps=6, save_every=3)
    model = tiny_model("llama")
    calls, forward = {"n": 0}, model.model.forward

    def killed_forward(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1 + 2 + 2 * 4:  # structure check, held-out (2), 4 steps x 2 micro-batches: killed in step 4
            raise KeyboardInterrupt("killed")
        return forward(*a, **k)

    model.model.forward = killed_forward
    with pytest.raises(KeyboardInterrupt):
        train(args, model, CharTokenizer(), progress=False)
    recorded = (tmp_path / "run" / "train_config.json").read_text()
    with pytest.raises(ValueError, match=r"\(lr 0\.01 -> 0\.05; steps 6 -> 9\); resume it with the recorded ones"):
        train(replace(args, lr=0.05, steps=9, resume=True), tiny_model("llama"), CharTokenizer(), progress=False)
    assert (tmp_path / "run" / "train_config.json").read_text() == recorded
    # what only changes logging may differ; the run ends as an uninterrupted one would, its config unchanged
    summary, _ = train(replace(args, resume=True, eval_every=2, report_to="none"), tiny_model("llama"), CharTokenizer(),
                       progress=False)
    assert summary["steps"] == 6 and (tmp_path / "run" / "train_config.json").read_text() == recorded
    assert "resume" in RESUME_MAY_CHANGE and "lr" not in RESUME_MAY_CHANGE


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_checkpoint(tmp_path, corpus):
    model = tiny_model("llama")
    body = model.model
    forward = body.forward
    calls = {"n": 0}

    def poisoned(*a, **k):
        calls["n"] += 1
        out = forward(*a, **k)
        if calls["n"] > 1 + 2 + 2 * 4 + 2:  # structure check, held-out, 4 steps, held-out at step 4: poison step 5
            out.last_hidden_state = out.last_hidden_state * float("nan")
        return out

    body.forward = poisoned
    with pytest.raises(TrainingDiverged, match=r"Loss became nan at step 5.*last good checkpoint"):
        train(args_for(tmp_path, corpus), model, CharTokenizer(), progress=False)
    state = torch.load(tmp_path / "run" / "checkpoint" / "state.pt", weights_only=True)
    assert state["step"] == 3 and all(torch.isfinite(t).all() for t in state["params"].values())


def test_lora_rank_matches_preproj_skip_within_one_percent():
    model = tiny_model("llama")
    d, n = 64, 3
    target = n * (2 * d * int(1.25 * d) + d * d)
    r = matched_lora_rank(model, target)
    peft_model = build_method(model, "lora")
    count = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert count == r * lora_params_per_rank(tiny_model("llama")) and abs(count - target) <= 0.01 * target
    assert peft_model.peft_config["default"].lora_alpha == 2 * r


def test_lora_rank_can_match_the_skip_alone():
    """--lora-rank skip: the LoRA with the skip's trainable parameters (a third of preproj+skip's), within 1%."""
    import transformers

    d, n = 576, 2  # SmolLM2-135M's width and attention (9 heads, 3 of them for K and V): rank 86 matches the skip
    config = transformers.LlamaConfig(hidden_size=d, num_hidden_layers=n, num_attention_heads=9, num_key_value_heads=3,
                                      intermediate_size=16, vocab_size=16)
    peft_model = build_method(transformers.AutoModelForCausalLM.from_config(config), "lora", lora_rank="skip")
    count = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert peft_model.peft_config["default"].r == 86 and abs(count - n * d * d) <= 0.01 * n * d * d
    with pytest.raises(ValueError, match="No LoRA rank comes within 1% of 12,288 parameters"):
        build_method(tiny_model("llama"), "lora", lora_rank="skip")  # 3 x 64 x 64: rank 9 gives 12,096
    with pytest.raises(ValueError, match="or one of preproj, skip, preproj\\+skip, got 'gate'"):
        build_method(tiny_model("llama"), "lora", lora_rank="gate")


def test_preproj_plus_lora_trains_both_and_round_trips(tmp_path, corpus):
    summary, model = train(args_for(tmp_path, corpus, method="preproj+lora", steps=3), tiny_model("llama"),
                           CharTokenizer(), progress=False)
    d = 64
    assert summary["trainable_params"] == 3 * 2 * d * int(1.25 * d) + 64 * lora_params_per_rank(tiny_model("llama"))
    assert (tmp_path / "run" / "lora" / "adapter_model.safetensors").is_file()
    loaded = load_adapter(tiny_model("llama"), tmp_path / "run")
    ids = torch.randint(0, 90, (1, 10))
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-6)


def test_lora_method_round_trips_through_load_adapter(tmp_path, corpus):
    _, model = train(args_for(tmp_path, corpus, method="lora", steps=3), tiny_model("gpt_neox"), CharTokenizer(),
                     progress=False)
    loaded = load_adapter(tiny_model("gpt_neox"), tmp_path / "run")
    ids = torch.randint(0, 90, (1, 10))
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-6)


def test_pure_bf16_reports_erased_updates(tmp_path, corpus):
    summary, _ = train(args_for(tmp_path, corpus, precision="bf16-true", lr=1e-5, steps=3),
                       tiny_model("llama", dtype=torch.bfloat16), CharTokenizer(), progress=False)
    assert 0.0 < summary["bf16_erased_update_fraction"] <= 1.0
    per_module = summary["bf16_erased_update_fraction_by_module"]
    assert set(per_module) == {"W_up", "W_down", "W_skip"} and all(0.0 <= f <= 1.0 for f in per_module.values())


def test_paper_lora_rank_is_the_authors_formula():
    import transformers

    from preproj.methods import paper_lora_rank

    pythia_160m = transformers.GPTNeoXConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                             intermediate_size=64, vocab_size=16)
    model = transformers.AutoModelForCausalLM.from_config(pythia_160m)
    assert paper_lora_rank(model) == 480  # docs/method.md: the frozen probe: r=480 at 160M, LoRA 26.5M parameters
    peft_model = build_method(tiny_model("llama"), "lora", lora_rank="paper")
    assert peft_model.peft_config["default"].r == int(1.25 * 64) // 2


def test_cosine_schedule_with_warmup():
    args = TrainArgs(steps=100, warmup=10, lr=1.0)
    assert lr_at(0, args) == pytest.approx(0.1) and lr_at(9, args) == pytest.approx(1.0)
    assert lr_at(10, args) == pytest.approx(1.0) and lr_at(55, args) == pytest.approx(0.5) and lr_at(99, args) < 0.01


def test_bad_arguments_are_clear(tmp_path, corpus):
    with pytest.raises(ValueError, match="method must be one of"):
        train(args_for(tmp_path, corpus, method="adapterv2"), tiny_model("llama"), CharTokenizer(), progress=False)
    with pytest.raises(ValueError, match="precision must be auto or one of"):
        train(args_for(tmp_path, corpus, precision="fp8"), tiny_model("llama"), CharTokenizer(), progress=False)
    with pytest.raises(ValueError, match="'bf16' alone is ambiguous"):
        train(args_for(tmp_path, corpus, precision="bf16"), tiny_model("llama"), CharTokenizer(), progress=False)


def test_attention_implementation_can_be_chosen_for_training(tmp_path, corpus):
    model = tiny_model("llama")
    summary, trained = train(args_for(tmp_path, corpus, steps=2, attn_implementation="eager"), model, CharTokenizer(),
                             progress=False)
    assert trained.config._attn_implementation == "eager"
    assert math.isfinite(summary["final_heldout_loss"])
    with pytest.raises(ValueError, match="attn_implementation must be 'sdpa' or 'eager'"):
        train(args_for(tmp_path, corpus, out=str(tmp_path / "other"), attn_implementation="flash"), tiny_model("llama"),
              CharTokenizer(), progress=False)


def test_tensorboard_gets_every_step_and_the_skip_norms(tmp_path, corpus):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(args_for(tmp_path, corpus, steps=4, report_to="tensorboard"), tiny_model("llama"), CharTokenizer(),
          progress=False)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/tokens_per_second", "train/heldout_loss", "skip_norm/layer_0",
            "skip_norm/layer_2"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
    assert [e.step for e in events.Scalars("train/heldout_loss")] == [0, 4]
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [round(e.value, 5) for e in events.Scalars("train/loss")] == [round(r["loss"], 5) for r in log[1:]]


def test_trackers_are_named_or_refused_clearly(tmp_path, corpus):
    with pytest.raises(ValueError, match="--report-to takes none, tensorboard, wandb, trackio"):
        train(args_for(tmp_path, corpus, report_to="mlflow"), tiny_model("llama"), CharTokenizer(), progress=False)
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ValueError, match="--report-to wandb needs the wandb package: pip install wandb"):
            train(args_for(tmp_path, corpus, out=str(tmp_path / "w"), report_to="wandb"), tiny_model("llama"),
                  CharTokenizer(), progress=False)


def test_packed_windows_start_with_the_tokenizers_bos_and_hold_none_inside():
    """A tokenizer that puts BOS before every text (Gemma, Llama) gets it first in every packed window and nowhere
    else; one that adds none packs the plain stream as it always did."""
    from conftest import BosCharTokenizer

    from preproj.training.windows import tokenize_examples

    texts = ["first line of text", "second line", "a third one, longer than the others"]
    plain = [t for text in texts for t in CharTokenizer().encode(text + "\n")]
    ids, labels = tokenize_examples(texts, BosCharTokenizer(), seq_len=8)
    assert ids.shape == (len(plain) // 7, 8) and torch.equal(labels, ids)
    assert (ids[:, 0] == 1).all() and not (ids[:, 1:] == 1).any()
    assert ids[:, 1:].flatten().tolist() == plain[: ids.shape[0] * 7]
    ids, _ = tokenize_examples(texts, CharTokenizer(), seq_len=8)
    assert ids.flatten().tolist() == plain[: len(plain) // 8 * 8]
    held, _ = tokenize_examples(texts, BosCharTokenizer(), seq_len=8, max_examples=2)
    assert held.shape == (2, 8) and (held[:, 0] == 1).all()


def test_a_special_tokens_spelling_in_training_text_stays_text():
    """WikiText-2's tokenized train spells rare words `<unk>`; a tokenizer with an `<unk>` special token (Gemma's)
    must encode it as those characters, not as a control token the model never learned to predict."""
    from conftest import byte_bpe_tokenizer

    from preproj.training.windows import tokenize_examples

    texts = ["the <unk> of the river was <unk> in 1900", "a second line about the river and its <unk>"] * 4
    tokenizer = byte_bpe_tokenizer(texts, 300, ["<eos>", "<unk>"], eos_token="<eos>", unk_token="<unk>")
    unk = tokenizer.unk_token_id
    assert unk in tokenizer.encode(texts[0])  # what the default encoding would have trained on
    for packing in ("pack", "lines"):
        ids, _ = tokenize_examples(texts, tokenizer, seq_len=16, packing=packing)
        assert not (ids == unk).any()
        assert "<unk>" in tokenizer.decode(ids[0] if packing == "lines" else ids.flatten())


def test_a_users_own_text_keeps_every_non_empty_line_in_any_of_three_forms(tmp_path):
    from preproj import data as datasets

    verse = ["roses are red", "", "violets are blue", "short lines", "are kept", "", "as they are"] * 10
    (tmp_path / "verse.txt").write_text("\n".join(verse))
    train, held, desc = datasets.training_corpus(str(tmp_path / "verse.txt"))
    assert len(train) + len(held) == 50 and len(held) == 2 and train[0] == "roses are red"
    assert desc == "verse.txt: 50 non-empty lines kept (20 blank dropped); the first 48 train, the last 2 held out"
    # the newline that ends a file's last line opens no blank line
    (tmp_path / "sixty.txt").write_text("".join(f"line {i}\n" for i in range(60)))
    desc = datasets.training_corpus(str(tmp_path / "sixty.txt"))[2]
    assert desc.startswith("sixty.txt: 60 non-empty lines kept (0 blank dropped);")
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps({"text": f"hi {i}\nhello {i}"}) for i in range(10)))
    train, held, _ = datasets.training_corpus(str(tmp_path / "chat.jsonl"))
    assert train[:2] == ["hi 0", "hello 0"] and len(train) + len(held) == 20
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "b.txt").write_text("x = 1\n\ny = 2")
    (folder / "a.txt").write_text("def f():\n    return 0")
    train, held, desc = datasets.training_corpus(str(folder))
    assert train + held == ["def f():", "    return 0", "x = 1", "y = 2"] and "(2 .txt files)" in desc
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(datasets.DataNotFound, match=r"bad.jsonl:2 has no 'text' string"):
        datasets.training_corpus(str(tmp_path / "bad.jsonl"))
    # the paper's rule (lines longer than 50 characters) still holds for the named corpora
    if data_dir() is not None:
        assert all(len(line.strip()) > 50 for line in datasets.training_corpus("tinystories", data_dir())[0])
