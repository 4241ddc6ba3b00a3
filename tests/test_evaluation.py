"""Evaluation internals on tiny models: windows, pair encoding, batching, statistics, data loading."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import CharTokenizer, data_dir, tiny_model

from preproj import data as datasets
from preproj.evaluation import LogLikelihood
from preproj.evaluation.tasks import mean_stderr, ratio_stderr
from preproj.evaluation.tasks.arc_easy import reader as arc_easy_reader
from preproj.evaluation.tasks.hellaswag import reader as hellaswag_reader
from preproj.evaluation.tasks.lambada import reader as lambada_reader
from preproj.evaluation.tasks.wikitext import reader as wikitext_reader
from preproj.evaluation.tasks.wikitext.reader import split_articles


@pytest.mark.parametrize("n", [1, 5, 16, 17, 40, 100])
@pytest.mark.parametrize("max_length", [1, 4, 16])
def test_rolling_windows_equal_the_harness(n, max_length):
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    score = LogLikelihood(tiny_model("llama"), CharTokenizer(), max_length=max_length, progress=False)
    tokens = list(range(100, 100 + n))
    expected = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 1, max_length, 1)]
    assert score.rolling_windows(tokens) == [tuple(w) for w in expected]
    assert [t for _, cont in score.rolling_windows(tokens) for t in cont] == tokens


def test_encode_pair_moves_trailing_space_to_the_continuation():
    score = LogLikelihood(tiny_model("llama"), CharTokenizer(), progress=False)
    ctx, cont = score.encode_pair("Answer: ", "yes")
    assert ctx == CharTokenizer().encode("Answer:") and cont == CharTokenizer().encode(" yes")
    assert score.encode_pair("", "abc") == ([1], CharTokenizer().encode("abc"))


def _reference(model, ctx, cont):
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), -1)
    rows = torch.arange(len(ctx) - 1, len(ctx) + len(cont) - 1)
    targets = torch.tensor(cont)
    return float(lp[rows, targets].sum()), bool((lp[rows].argmax(-1) == targets).all())


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gpt2"])
def test_batched_scores_equal_one_at_a_time_full_logits(family):
    model = tiny_model(family)
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(3, 90, (int(a),), generator=g).tolist(),
              torch.randint(3, 90, (int(b),), generator=g).tolist())
             for a, b in [(5, 3), (1, 1), (30, 7), (12, 12), (2, 20)]]
    score = LogLikelihood(model, CharTokenizer(), batch_tokens=64, progress=False)
    assert score.fast
    for (ll, greedy), pair in zip(score(pairs), pairs, strict=True):
        ref_ll, ref_greedy = _reference(model, *pair)
        assert ll == pytest.approx(ref_ll, rel=1e-5, abs=1e-4) and greedy == ref_greedy


def _groups(seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def rnd(n):
        return torch.randint(3, 90, (n,), generator=g).tolist()

    # the first group has one choice: packing is checked on the first group it applies to
    return [(rnd(a), [rnd(b) for b in bs]) for a, bs in [(9, [4]), (5, [3, 1, 4, 2]), (1, [1, 1]), (30, [7, 2, 5, 9]),
                                                          (12, [12, 3]), (2, [20, 1, 1, 6])]]


def _same(a, b) -> bool:
    return all(x[0] == pytest.approx(y[0], rel=1e-5, abs=1e-5) and x[1] == y[1] for x, y in zip(a, b, strict=True))


def _packed_and_pairs(model, **kwargs):
    groups = _groups()
    packed = LogLikelihood(model, CharTokenizer(), batch_tokens=64, progress=False, **kwargs)
    plain = LogLikelihood(model, CharTokenizer(), batch_tokens=64, progress=False, max_length=kwargs.get("max_length"))
    return packed, packed.choices(groups), plain([(ctx, cont) for ctx, conts in groups for cont in conts])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_choices_score_as_the_pairs_do(family, attn):
    model = tiny_model(family)
    if attn == "eager":
        model.set_attn_implementation("eager")
    elif model.config._attn_implementation != "sdpa":
        pytest.skip(f"{family} has no sdpa attention")
    score, packed, pairs = _packed_and_pairs(model)
    assert score.pack_checked is True and _same(packed, pairs)  # packing was used, not fallen back from


def test_packed_choices_of_an_adapted_model_and_of_truncated_or_alibi_models_still_score_as_pairs():
    import transformers
    from conftest import VOCAB
    from test_attach import set_adapter

    from preproj import PreProjConfig, attach

    model = attach(tiny_model("llama"), PreProjConfig(mode="preproj+skip"))
    set_adapter(model, "random")
    score, packed, pairs = _packed_and_pairs(model)
    assert score.pack_checked and _same(packed, pairs)
    # A group longer than max_length is left-truncated per choice, as the harness does: scored as pairs.
    score, packed, pairs = _packed_and_pairs(tiny_model("llama"), max_length=24)
    assert _same(packed, pairs)
    # BLOOM's ALiBi ignores position ids: packing is checked, found to disagree, and not used.
    torch.manual_seed(0)
    bloom = transformers.AutoModelForCausalLM.from_config(transformers.BloomConfig(vocab_size=VOCAB, hidden_size=64,
                                                                                   n_layer=2, n_head=4)).eval()
    score, packed, pairs = _packed_and_pairs(bloom)
    assert score.pack_checked is False and packed == pairs
    score, packed, pairs = _packed_and_pairs(tiny_model("llama"), pack=False)
    assert score.pack_checked is None and packed == pairs


def test_greedy_flag_is_true_when_the_continuation_is_the_argmax():
    model = tiny_model("llama")
    ctx = [5, 6, 7]
    cont = []
    with torch.no_grad():
        for _ in range(4):
            cont.append(int(model(torch.tensor([ctx + cont])).logits[0, -1].argmax()))
    score = LogLikelihood(model, CharTokenizer(), progress=False)
    (_, greedy), (_, greedy_wrong) = score([(ctx, cont), (ctx, cont[:-1] + [(cont[-1] + 1) % 97])])
    assert greedy and not greedy_wrong


def test_too_long_continuation_is_a_clear_error():
    score = LogLikelihood(tiny_model("llama"), CharTokenizer(), max_length=8, progress=False)
    with pytest.raises(ValueError, match="cannot be scored with max_length 8"):
        score([([1], list(range(3, 12)))])


def test_statistics():
    x = [1.0, 0.0, 1.0, 1.0]
    assert mean_stderr(x) == pytest.approx(np.std(x, ddof=1) / 2)
    # ratio estimator: equal weights reduce to the stderr of the mean
    assert ratio_stderr([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == pytest.approx(mean_stderr([1.0, 2.0, 3.0]))
    assert math.isnan(mean_stderr([1.0]))


def test_article_split_and_detokenizer():
    raw = " \n = A = \n \n x @-@ y , z . \n = = Sec = = \n w \n = B = \n q \n"
    pages = split_articles(raw)
    assert pages == [" = A = \n \n x @-@ y , z . \n = = Sec = = \n w ", " = B = \n q \n"]
    assert wikitext_reader.detokenize(" x @-@ y , z . \n") == " x-y, z.\n"


def test_wikitext_scores_the_detokenized_page_unless_asked_for_the_raw_one():
    from preproj.evaluation.tasks.wikitext import harness as wikitext_harness

    score = LogLikelihood(tiny_model("llama"), CharTokenizer(), max_length=8, progress=False)
    page = " = A = \n \n x @-@ y , z . \n"
    for detokenize, text in ((True, wikitext_reader.detokenize(page)), (False, page)):
        items: list[dict] = []
        wikitext_harness(score, [{"page": page}], items, detokenize=detokenize)
        whole = sum(score([w])[0][0] for w in score.rolling_windows(score.encode(text)))
        assert items[0]["tokens"] == len(text) and items[0]["ll"] == pytest.approx(whole, rel=1e-6)


@pytest.mark.integration
def test_local_data_counts():
    d = data_dir()
    assert d is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    assert len(lambada_reader.items(d)) == 5153
    assert len(wikitext_reader.documents(d)) == 62
    assert len(hellaswag_reader.items(d)) == 1000 and len(hellaswag_reader.items(d, full=True)) == 10042
    assert len(arc_easy_reader.items(d)) == 2376 and len(arc_easy_reader.items(d, "validation")) == 570
    first = arc_easy_reader.items(d)[0]
    assert first["question"].startswith("Which statement best explains") and first["gold"] == 0
    label_counts = np.bincount([doc["gold"] for doc in hellaswag_reader.items(d, full=True)])
    assert label_counts.tolist() == [2515, 2485, 2584, 2458]


@pytest.mark.integration
def test_paper_hellaswag_is_the_validation_set_in_original_order_with_raw_text():
    """The author scores the first 500 of hellaswag_val.jsonl as raw ctx + " " + ending. Every original record
    of the local subset that lies among the first HELLASWAG_RAW_ITEMS items equals its reconstruction."""
    d = data_dir()
    assert d is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    docs, source = hellaswag_reader.items_in_order(d)
    assert len(docs) == 10042 and "original order" in source
    assert docs[0]["raw_ctx"] == "A man is sitting on a roof. he" and docs[0]["gold"] == 3
    assert docs[0]["raw_endings"][3] == "starts pulling up roofing on a roof."
    position = {tuple(e.strip() for e in doc["raw_endings"]): i for i, doc in enumerate(docs)}
    checked = 0
    for record in datasets.jsonl_rows(d / hellaswag_reader.VALIDATION.file):
        i = position.get(tuple(e.strip() for e in record["endings"]))
        if i is None or i >= hellaswag_reader.HELLASWAG_RAW_ITEMS:
            continue
        checked += 1
        assert (docs[i]["raw_ctx"], docs[i]["raw_endings"], docs[i]["gold"]) == (
            record["ctx"], record["endings"], int(record["label"]))
    assert checked == 881


def test_missing_data_says_which_file_and_how(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(datasets.DataNotFound, match=r"no file .*lambada/lambada_test.jsonl.*--data-dir"):
        lambada_reader.items(tmp_path)


def test_paper_protocol_definitions():
    from preproj.evaluation.tasks.lambada import paper as lambada_paper
    from preproj.evaluation.tasks.wikitext import paper as wikitext_paper

    model = tiny_model("llama")
    score = LogLikelihood(model, CharTokenizer(), progress=False)
    # LAMBADA (paper): items over 512 tokens are skipped, the rest scored by greedy exact match.
    docs = [{"text": "a b c d e"}, {"text": "x " * 600 + "end"}]
    result = lambada_paper(score, docs)
    assert result["n"] == 1 and result["skipped_over_512_tokens"] == 1
    # WikiText (paper): exp of the mean over lines of each line's mean token loss.
    lines = ["the first line of text, long enough to pass the paper's 50-character rule\n",
             "a second, different line, which is also long enough to be scored by the rule\n"]
    ref = []
    for line in lines:
        ids = torch.tensor([CharTokenizer().encode(line)])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])
        ref.append(-float(lp.mean()))
    assert wikitext_paper(score, lines)["perplexity"] == pytest.approx(math.exp(np.mean(ref)), rel=1e-5)


@pytest.mark.integration
def test_paper_wikitext_rows_are_the_authors(smollm2):
    """07_benchmarks.py evaluate_perplexity, written out: the first 300 rows of the Hub's validation split
    (one row per line of the raw file, blank rows '', each other row keeping its newline), scored if the
    stripped row has >= 50 characters and tokenises, truncated to 512, to >= 10 tokens."""
    from preproj.evaluation.tasks.wikitext import paper_rows as paper_wikitext_rows

    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    _, tokenizer = smollm2
    with open(data_dir() / "wikitext-2-raw" / "wiki.valid.raw", encoding="utf-8") as f:
        hub_rows = [line if line.strip() else "" for line in f]
    author = []
    for text in hub_rows[:300]:
        if len(text.strip()) < 50:
            continue
        if tokenizer(text, return_tensors="pt", truncation=True, max_length=512).input_ids.shape[1] < 10:
            continue
        author.append(text)
    ours = paper_wikitext_rows(wikitext_reader.rows("valid", data_dir()), tokenizer.encode)
    assert len(ours) == len(author) and 100 < len(author) < 200
    assert ours[0][0] == author[0] and ours[-1][0] == author[-1] and ours[-1][0].endswith("\n")
    old_rule = [line for line in datasets.wikitext_lines("valid", data_dir()) if len(line.strip()) > 50][:300]
    assert len(old_rule) > 1.5 * len(ours)  # what the protocol scored before: about twice the text


@pytest.mark.integration
def test_per_item_records_round_trip_and_give_the_metrics(tmp_path):
    from preproj.evaluation import evaluate, read_items

    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    model = tiny_model("llama")
    out, items = tmp_path / "r.json", tmp_path / "r.items.jsonl"
    report = evaluate(model, CharTokenizer(), ["lambada", "arc_easy", "hellaswag", "wikitext"], limit=3, max_length=128,
                      data_dir=data_dir(), progress=False, out=out, items_out=items)
    by_task = read_items(items)
    assert report["items_file"] == str(items) and set(by_task) == {"lambada", "arc_easy", "hellaswag", "wikitext"}
    for task, m in report["tasks"].items():
        assert len(by_task[task]) == m["n"] == 3 and [r["index"] for r in by_task[task]] == [0, 1, 2]
    assert np.mean([r["acc"] for r in by_task["lambada"]]) == report["tasks"]["lambada"]["acc"]
    assert math.exp(-np.mean([r["ll"] for r in by_task["lambada"]])) \
        == pytest.approx(report["tasks"]["lambada"]["perplexity"])
    for task in ("arc_easy", "hellaswag"):
        recs = by_task[task]
        assert np.mean([r["acc_norm"] for r in recs]) == report["tasks"][task]["acc_norm"]
        assert all(r["acc"] == float(np.argmax(r["lls"]) == r["gold"]) for r in recs)
    docs = by_task["wikitext"]
    ppl = math.exp(-sum(r["ll"] for r in docs) / sum(r["words"] for r in docs))
    assert ppl == pytest.approx(report["tasks"]["wikitext"]["word_perplexity"], rel=1e-12)
    assert sum(r["tokens"] for r in docs) == report["tasks"]["wikitext"]["tokens"]
    # the same documents as the file has them (the training text's format): spaced punctuation, more characters
    as_file = evaluate(model, CharTokenizer(), ["wikitext_file"], limit=3, max_length=128, data_dir=data_dir(),
                       progress=False)["tasks"]["wikitext_file"]
    assert as_file["n"] == 3 and as_file["tokens"] > report["tasks"]["wikitext"]["tokens"]
    with pytest.raises(ValueError, match="harness protocol's WikiText"):
        evaluate(model, CharTokenizer(), ["wikitext_file"], protocol="paper", data_dir=data_dir(), progress=False)
    # the paper's WikiText (the bf16 question's metric): one record per scored row, exp of the mean row loss
    model.config.max_position_embeddings = 1024  # a row is up to 512 tokens, here characters; RoPE has no table
    paper = evaluate(model, CharTokenizer(), ["wikitext"], protocol="paper", max_length=1024, data_dir=data_dir(),
                     progress=False, out=tmp_path / "p.json", items_out=tmp_path / "p.items.jsonl")
    rows = read_items(tmp_path / "p.items.jsonl")["wikitext"]
    assert len(rows) == paper["tasks"]["wikitext"]["n"] > 100
    assert math.exp(np.mean([-r["ll"] / r["tokens"] for r in rows])) == pytest.approx(
        paper["tasks"]["wikitext"]["perplexity"], rel=1e-12)


def test_paper_lambada_target_has_no_bos_for_tokenizers_that_add_one():
    from conftest import BosCharTokenizer

    from preproj.evaluation.tasks.lambada import paper as lambada_paper

    score = LogLikelihood(tiny_model("llama"), BosCharTokenizer(), progress=False)
    items = []
    lambada_paper(score, [{"text": "a b c word"}], items)
    assert items[0]["tokens"] == len(" word")  # the BOS would make it 6, and the target unguessable
    assert score.encode_special("ab")[0] == BosCharTokenizer.bos_token_id and score.encode("ab")[0] != 1


def test_a_merged_lora_scores_as_the_unmerged_one(tmp_path):
    """Evaluation merges a LoRA into the base weights (the base's cost): the same log-likelihoods up to rounding."""
    from preproj.evaluation import LogLikelihood
    from preproj.methods.lora import attach_lora, merged_for_evaluation

    torch.manual_seed(0)
    lora = attach_lora(tiny_model("llama"), rank=4)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)  # B starts at zero: make the adapter change the model
    pairs = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])]
    unmerged = LogLikelihood(lora, CharTokenizer(), progress=False)(pairs)
    from peft.tuners.lora import LoraLayer

    merged_model = merged_for_evaluation(lora)
    layers = [m for m in merged_model.modules() if isinstance(m, LoraLayer)]
    assert layers and all(m.merged for m in layers)
    merged = LogLikelihood(merged_model, CharTokenizer(), progress=False)(pairs)
    for (ll_u, greedy_u), (ll_m, greedy_m) in zip(unmerged, merged):
        assert ll_m == pytest.approx(ll_u, abs=1e-4) and greedy_m == greedy_u
    assert any(abs(u[0] - b[0]) > 1e-3 for u, b in zip(unmerged, LogLikelihood(tiny_model("llama"), CharTokenizer(),
                                                                                 progress=False)(pairs)))


def test_no_data_directory_offline_fails_at_once_and_names_the_variable_only_as_unset(monkeypatch):
    import time

    from preproj.runtime import hub

    monkeypatch.delenv("PREPROJ_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    hub.reachable.cache_clear()
    start = time.monotonic()
    with pytest.raises(datasets.DataNotFound,
                       match=r"no --data-dir given and \$PREPROJ_DATA_DIR is not set.*unreachable"):
        lambada_reader.items(datasets.resolve_data_dir(None))
    assert time.monotonic() - start < 10
    hub.reachable.cache_clear()


def test_a_stopped_scoring_resumes_from_its_journal_with_the_same_numbers(tmp_path, monkeypatch):
    """Batches already in the journal are not scored again; a half-written last line (a crash while writing) and
    the batches of other weights (another key) are never used."""
    model, groups, journal = tiny_model("llama"), _groups(), tmp_path / "scores.journal"
    real, calls = LogLikelihood._score_batch, []

    def counted(self, batch, n, stop_after=None):
        if stop_after is not None and len(calls) == stop_after:
            raise KeyboardInterrupt
        calls.append(n)
        return real(self, batch, n)

    def scored(key: str, stop_after: int | None = None) -> tuple[list, int]:
        calls.clear()
        monkeypatch.setattr(LogLikelihood, "_score_batch",
                            lambda self, batch, n: counted(self, batch, n, stop_after))
        score = LogLikelihood(model, CharTokenizer(), batch_tokens=32, progress=False, journal=journal,
                              journal_key=key)
        return score.choices(groups), len(calls)

    whole, batches = scored("fresh weights")
    journal.unlink()
    with pytest.raises(KeyboardInterrupt):
        scored("weights", stop_after=4)  # the packing check's two, then two batches
    kept = len(journal.read_text().splitlines())
    assert kept == 2
    with open(journal, "a") as f:
        f.write('{"key": "weights", "piece": 7, "val')
    resumed, rescored = scored("weights")
    assert resumed == whole and rescored == batches - kept  # bit for bit, and only what was left
    other, rescored = scored("other weights")
    assert other == whole and rescored == batches


def test_evaluate_removes_its_journal_when_it_returns(tmp_path):
    from preproj.evaluation import evaluate

    journal = tmp_path / "eval.journal"
    plain = evaluate(tiny_model("llama"), CharTokenizer(), ["wikitext"], limit=2, max_length=32, data_dir=data_dir(),
                     progress=False)
    kept = evaluate(tiny_model("llama"), CharTokenizer(), ["wikitext"], limit=2, max_length=32, data_dir=data_dir(),
                    progress=False, journal=journal, journal_key="w")
    assert kept["tasks"] == plain["tasks"] and not journal.exists()


def test_evaluate_says_which_adapter_the_model_carries(tmp_path):
    from preproj import PreProjConfig, attach, detach, load_adapter, save_adapter
    from preproj.evaluation import evaluate

    def adapter_of(model, **kw):
        return evaluate(model, CharTokenizer(), ["wikitext"], limit=1, max_length=32, data_dir=data_dir(),
                        progress=False, **kw)["adapter"]

    assert adapter_of(tiny_model("llama")) is None
    model = attach(tiny_model("llama"), PreProjConfig(mode="skip"))
    assert adapter_of(model) == "skip (attached in memory)"
    save_adapter(model, tmp_path / "a")
    loaded = load_adapter(tiny_model("llama"), tmp_path / "a")
    assert adapter_of(loaded) == str(tmp_path / "a") and adapter_of(loaded, adapter="named") == "named"
    assert adapter_of(detach(loaded)) is None


def test_each_process_keeps_its_own_journal(tmp_path, monkeypatch):
    score = LogLikelihood(tiny_model("llama"), CharTokenizer(), progress=False, journal=tmp_path / "j", journal_key="w")
    assert score.journal_path() == tmp_path / "j"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert score.journal_path() == tmp_path / "j.rank1"


@pytest.mark.parametrize("merge", [True, False])
def test_evaluate_scores_a_lora_merged_as_preproj_eval_does_and_gives_the_model_back_exactly(merge, monkeypatch,
                                                                                            tmp_path):
    from peft.tuners.lora import LoraLayer

    from preproj.evaluation import runner
    from preproj.methods.lora import attach_lora

    torch.manual_seed(0)
    lora = attach_lora(tiny_model("llama"), rank=4)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    layers = [m for m in lora.modules() if isinstance(m, LoraLayer)]
    before = {k: v.clone() for k, v in lora.state_dict().items()}
    seen = []

    def scored(score, task, *args):
        seen.append([m.merged for m in layers])
        return {"acc": 0.0, "n": 0}

    monkeypatch.setattr(runner, "run_task", scored)
    runner.evaluate(lora, CharTokenizer(), ["lambada"], progress=False, data_dir=tmp_path, compile=False,
                    merge_lora=merge)
    assert seen == [[merge] * len(layers)]
    assert not any(m.merged for m in layers)
    after = lora.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the weights are bit for bit what they were"


def test_evaluate_given_eval_args_is_preproj_eval(tmp_path, capsys):
    """`evaluate(EvalArgs(...))` loads what the arguments name and writes what `preproj eval` writes: the same
    numbers and the same per-item records."""
    import json

    from conftest import tiny_model_dir

    from preproj.cli import main
    from preproj.evaluation.runner import EvalArgs, evaluate

    if data_dir() is None:
        pytest.skip("../shared/data is not here")
    model = tiny_model_dir(tmp_path / "model", ["the quick brown fox jumps over the lazy dog"] * 50)
    common = dict(model=str(model), tasks="lambada,arc_easy", limit=5, max_length=64, device="cpu",
                  data_dir=str(data_dir()), items=True)
    results = evaluate(EvalArgs(**common, out=str(tmp_path / "api.json")), progress=False)
    assert main(["eval", "--model", str(model), "--tasks", "lambada,arc_easy", "--limit", "5", "--max-length", "64",
                 "--device", "cpu", "--data-dir", str(data_dir()), "--items", "--out", str(tmp_path / "cli.json")]) == 0
    assert "summary: lambada acc" in capsys.readouterr().out
    cli = json.loads((tmp_path / "cli.json").read_text())
    assert cli["tasks"] == results["tasks"] and results["tasks"]["lambada"]["n"] == 5
    assert (tmp_path / "cli.items.jsonl").read_text() == (tmp_path / "api.items.jsonl").read_text()
    with pytest.raises(ValueError, match="--items writes next to --out"):
        evaluate(EvalArgs(**common))


def test_every_task_with_a_harness_declaration_is_written_from_its_folder(tmp_path):
    """write_local_tasks reads each task's own declaration: its config with the path of the file its reader names or
    writes, and the helper modules copied from lm_eval; a limit on a file the task does not write is refused."""
    import json as _json

    from preproj.evaluation.harness import harness_tasks, write_local_tasks
    from preproj.evaluation.tasks import TASK_TABLE

    assert harness_tasks() == ["lambada", "hellaswag", "arc_easy", "wikitext"]
    data = data_dir()
    names = write_local_tasks(tmp_path, data, limits={"wikitext": 2, "arc_easy": 3})
    assert names == [f"preproj_{t}" for t in harness_tasks()]
    assert (tmp_path / "hellaswag" / "utils.py").is_file()
    assert (tmp_path / "wikitext" / "preprocess_wikitext.py").is_file()
    assert len((tmp_path / "wikitext" / "pages.jsonl").read_text().splitlines()) == 2
    arc = [_json.loads(line) for line in (tmp_path / "arc_easy" / "arc_easy_test.jsonl").read_text().splitlines()]
    assert len(arc) == 3 and set(arc[0]["choices"]) == {"text", "label"}
    config = (tmp_path / "lambada" / "preproj_lambada.yaml").read_text()
    assert "{path}" not in config and _json.dumps(str(data / "lambada" / "lambada_test.jsonl")) in config
    with pytest.raises(ValueError, match="lambada's harness config reads the data directory's file"):
        TASK_TABLE["lambada"].harness.data_file(tmp_path, data, 5)



def test_a_task_registered_from_outside_brings_its_own_harness_config(tmp_path, monkeypatch):
    from preproj.evaluation.harness import write_local_tasks
    from preproj.evaluation.tasks import TASK_TABLE, HarnessCopy, Task

    def data_file(folder, data, limit):
        (folder / "rows.jsonl").write_text('{"q": "2+2", "a": "4"}\n')
        return folder / "rows.jsonl"

    config = "task: preproj_sums\ndataset_path: json\ndataset_kwargs: {data_files: {test: {path}}}\n"
    toy = Task("sums", "toy", lambda *a, **k: {}, {}, default=False, harness=HarnessCopy(data_file, config=config))
    monkeypatch.setitem(TASK_TABLE, "sums", toy)
    assert "preproj_sums" in write_local_tasks(tmp_path / "h", data_dir())
    written = (tmp_path / "h" / "sums" / "preproj_sums.yaml").read_text()
    assert written == config.replace("{path}", '"' + str(tmp_path / "h" / "sums" / "rows.jsonl") + '"')
