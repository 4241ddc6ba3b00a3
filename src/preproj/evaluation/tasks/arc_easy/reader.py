"""ARC-Easy's items: AI2's JSONL from the data directory, else allenai/ai2_arc from the Hub."""

from __future__ import annotations

import json
from pathlib import Path

from ....data import Source, hub_rows, jsonl_rows, local_file

TEST = Source("arc_easy", "arc/ARC-Easy-Test.jsonl", ("allenai/ai2_arc", "ARC-Easy", "test"))
VALIDATION = Source("arc_easy_validation", "arc/ARC-Easy-Dev.jsonl", ("allenai/ai2_arc", "ARC-Easy", "validation"))


def items(data_dir: Path | None = None, split: str = "test") -> list[dict]:
    """[{'question','choices','gold'}] from AI2's JSONL (test = harness arc_easy, validation = the paper's)."""
    source = TEST if split == "test" else VALIDATION
    path = local_file(source, data_dir)
    if path:
        rows = jsonl_rows(path)
        return [
            {
                "question": r["question"]["stem"],
                "choices": [c["text"] for c in r["question"]["choices"]],
                "gold": [c["label"] for c in r["question"]["choices"]].index(r["answerKey"]),
            }
            for r in rows
        ]
    return [
        {"question": r["question"], "choices": list(r["choices"]["text"]),
         "gold": list(r["choices"]["label"]).index(r["answerKey"])}
        for r in hub_rows(source, data_dir)
    ]


def harness_file(folder: Path, data_dir: Path, limit: int | None = None) -> Path:
    """The test split in allenai/ai2_arc's columns, which its harness.yaml reads, written into folder from AI2's
    JSONL (base.HarnessCopy)."""
    out = folder / "arc_easy_test.jsonl"
    with open(data_dir / TEST.file) as src, open(out, "w") as dst:
        for k, line in enumerate(src):
            if limit is not None and k >= limit:
                break
            r = json.loads(line)
            choices = r["question"]["choices"]
            dst.write(json.dumps({"id": r["id"], "question": r["question"]["stem"], "answerKey": r["answerKey"],
                                  "choices": {"text": [c["text"] for c in choices],
                                              "label": [c["label"] for c in choices]}}) + "\n")
    return out
