"""HellaSwag's items: the harness's preprocessing of the validation set (a 1000-record subset locally, else the
Hub), llama.cpp's file of all 10,042 items, and the set in its original order for the paper protocol."""

from __future__ import annotations

import re
from pathlib import Path

from ....data import Source, hub_rows, jsonl_rows, local_file, local_only

VALIDATION = Source("hellaswag", "hellaswag/hellaswag_val_subset1000.jsonl", ("Rowan/hellaswag", None, "validation"))
FULL = Source("hellaswag_full", "hellaswag/hellaswag_val_full.txt")  # llama.cpp's format; no Hub copy
FULL_NOTE = (
    "hellaswag_full uses llama.cpp's text format of all 10,042 items; its preprocessing differs slightly from the "
    "harness's (first letter of ctx_b not capitalised, a leading space left on 134/4000 endings), so scores match "
    "llama.cpp's HellaSwag, not the harness's to the decimal."
)


def preprocess(text: str) -> str:
    """The harness's HellaSwag cleaning: WikiHow [title]/[step] artefacts out, double spaces collapsed."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _hellaswag_doc(r: dict) -> dict:
    ctx = r["ctx_a"] + " " + r["ctx_b"].capitalize()
    return {
        "query": preprocess(r["activity_label"] + ": " + ctx),
        "choices": [preprocess(e) for e in r["endings"]],
        "gold": int(r["label"]),
        "raw_ctx": r["ctx"],  # the paper protocol scores raw ctx + " " + ending
        "raw_endings": list(r["endings"]),
    }


def items(data_dir: Path | None = None, full: bool = False) -> list[dict]:
    """[{'query','choices','gold','raw_ctx','raw_endings'}]; full=True reads llama.cpp's 10,042-item file."""
    if full:
        return _hellaswag_full(data_dir)
    path = local_file(VALIDATION, data_dir)
    rows = jsonl_rows(path) if path else list(hub_rows(VALIDATION, data_dir))
    return [_hellaswag_doc(r) for r in rows]


def _hellaswag_full(data_dir: Path | None) -> list[dict]:
    path = local_file(FULL, data_dir)
    if path is None:
        raise local_only("hellaswag_full", FULL, data_dir)
    lines = path.read_text(encoding="utf-8").split("\n")
    docs = []
    for i in range(0, len(lines) - 5, 6):
        query, gold, endings = lines[i], int(lines[i + 1]), lines[i + 2 : i + 6]
        docs.append({"query": query, "choices": endings, "gold": gold, "raw_ctx": query, "raw_endings": endings})
    return docs


# The validation set opens with its ActivityNet items, whose text carries no [tags], so llama.cpp's
# preprocessing leaves ctx untouched: its query is activity_label + ": " + ctx. Checked on the local data:
# every record of the 1000-record subset that lies among the first 3000 items (881) equals its
# reconstruction in ctx, endings and label. WikiHow items (from about item 3240) lost their [tags].
HELLASWAG_RAW_ITEMS = 3000


def items_in_order(data_dir: Path | None = None) -> tuple[list[dict], str]:
    """The validation set in its original order with raw ctx and endings (the paper protocol's 'first 500'),
    and where it came from: the local full file, else the Hub."""
    if local_file(FULL, data_dir) is None:
        return ([_hellaswag_doc(r) for r in hub_rows(VALIDATION, data_dir)],
                "HellaSwag validation (Hub), original order")
    docs = _hellaswag_full(data_dir)
    for doc in docs[:HELLASWAG_RAW_ITEMS]:
        doc["raw_ctx"] = doc["raw_ctx"].split(": ", 1)[1]
    return docs, (f"HellaSwag validation in original order from {FULL.file}, raw ctx recovered by "
                  f"removing the activity label; exact for the first {HELLASWAG_RAW_ITEMS} items, beyond which "
                  "llama.cpp's preprocessing removed WikiHow's [tags]")


def harness_file(folder: Path, data_dir: Path, limit: int | None = None) -> Path:
    """The file its harness.yaml reads: the data directory's own (base.HarnessCopy)."""
    if limit is not None:
        raise ValueError("hellaswag's harness config reads the data directory's file; cut its items with the harness's "
                         "own limit.")
    return data_dir / VALIDATION.file
