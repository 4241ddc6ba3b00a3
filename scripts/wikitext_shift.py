"""Why does the study's preproj+skip lower the held-out loss on raw WikiText-2 valid during training, yet raise
the WikiText-2 test perplexity it is scored on?

The two measurements differ in two ways, and this scores the base and trained adapters on the same test
documents in all four combinations, paired over documents (and seeds):
  text:   'harness' (the harness's detokenized text, as reported) or 'raw' (the file as it is: spaced
          punctuation, ' @-@ ', like the tokenized WikiText-2 train text the adapter learned from);
  window: 2048 tokens (as reported) or 256 (the training sequence length), in the harness's rolling windows.
Each (model, text, window) is written to OUT as soon as it is scored, so the script resumes where it stopped.
With --study, the reported combination (harness text, 2048) is taken from that comparison's per-item records.

  PREPROJ_DATA_DIR=../shared/data .venv/bin/python scripts/wikitext_shift.py --study results/study-cpu \
      --adapters results/study-cpu/preproj+skip-seed42,results/study-cpu/preproj+skip-seed43 --docs 8 \
      --out results/wikitext-shift
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from preproj import data, load_adapter, load_model
from preproj.analysis.stats import describe, paired_bootstrap, ratio_of_sums
from preproj.evaluation import LogLikelihood, read_items
from preproj.evaluation.tasks.wikitext import harness as wikitext_harness
from preproj.evaluation.tasks.wikitext import reader as wikitext_reader
from preproj.runtime.files import atomic_write, kept, write_json

CONDITIONS = [(text, window) for text in ("harness", "raw") for window in (2048, 256)]


def score_documents(model, tokenizer, pages: list[str], text: str, window: int) -> list[list[float]]:
    """[nll, tokens] per document: every token predicted once, in disjoint rolling windows of `window` tokens."""
    items: list[dict] = []
    score = LogLikelihood(model, tokenizer, max_length=window, precision="fp32")
    wikitext_harness(score, [{"page": p} for p in pages], items, detokenize=text == "harness")
    return nll_and_tokens(items)


def nll_and_tokens(records: list[dict]) -> list[list[float]]:
    """[nll, tokens] per document from WikiText per-item records."""
    return [[-r["ll"], r["tokens"]] for r in records]


def scored(path: Path, documents: int) -> bool:
    """Whether `path` holds the scores of exactly this many documents (a run with another --docs rescored)."""
    return path.is_file() and len(json.loads(path.read_text())) == documents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapters", required=True, help="Comma-separated adapter directories (the seeds of one method).")
    ap.add_argument("--docs", type=int, default=8, help="Score the first N of the 62 WikiText-2 test documents.")
    ap.add_argument("--study", help="A compare directory whose runs' items.wikitext.jsonl give (harness, 2048).")
    ap.add_argument("--out", default="results/wikitext-shift")
    args = ap.parse_args()
    out = Path(args.out)
    pages = [d["page"] for d in wikitext_reader.documents(data.resolve_data_dir())][: args.docs]
    runs = {"base": None} | {Path(a).name: a for a in args.adapters.split(",")}
    for name, adapter in runs.items():
        study_items = Path(args.study or "", "base-seed42" if name == "base" else name, "items.wikitext.jsonl")
        if args.study and kept(study_items) and not scored(out / f"{name}.harness-2048.json", len(pages)):
            records = read_items(study_items)["wikitext"][: len(pages)]
            write_json(out / f"{name}.harness-2048.json", nll_and_tokens(records))
        todo = [(t, w) for t, w in CONDITIONS if not scored(out / f"{name}.{t}-{w}.json", len(pages))]
        if not todo:
            continue
        model, tokenizer = load_model(args.model, dtype="fp32")
        if adapter:
            model = load_adapter(model, adapter)
        model.eval()
        for text, window in todo:
            write_json(out / f"{name}.{text}-{window}.json", score_documents(model, tokenizer, pages, text, window))

    lines = [f"Loss per token (nats), adapters minus base, on the first {len(pages)} WikiText-2 test documents; "
             "95% interval: a paired bootstrap over documents, widened by the seeds' variance (stats.py).", "",
             "| text | window | base | adapters | difference [95% interval] |", "|---|---|---|---|---|"]
    results = []
    for text, window in CONDITIONS:
        a = np.array([json.loads((out / f"base.{text}-{window}.json").read_text())])  # (1 seed, docs, 2)
        b = np.array([json.loads((out / f"{name}.{text}-{window}.json").read_text()) for name in list(runs)[1:]])
        p = paired_bootstrap(a, b, ratio_of_sums, metric=f"loss.{text}-{window}", higher_is_better=False)
        results.append({"text": text, "window": window, **p.to_dict()})
        lines.append(f"| {text} | {window} | {p.a:.4f} | {p.b:.4f} | {describe(p, 4)} |")
    write_json(out / "paired.json", {"documents": len(pages), "adapters": list(runs)[1:], "paired": results})
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
