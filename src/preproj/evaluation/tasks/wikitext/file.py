"""WikiText-2 test documents as the file has them (spaced punctuation, ' @-@ '): the format of the tokenized
training text, where the paper measures; the harness (and task wikitext) scores them detokenized."""

from __future__ import annotations

from dataclasses import replace

from ..base import Task, first, no_protocol
from . import HELDOUT_LOSS, WORD_PERPLEXITY, harness, reader


def run(score, protocol: str, limit: int | None, data_dir, items: list | None = None,
        notes: list | None = None) -> dict:
    if protocol != "harness":
        raise no_protocol("wikitext_file", protocol, "it is the harness protocol's WikiText in the file's own format; "
                          "the paper protocol scores its own WikiText rows (task wikitext).")
    return harness(score, first(reader.documents(data_dir), limit), items, detokenize=False)


TASK = Task("wikitext_file", "WikiText-2 test in the file's own format (the training text's)", run,
            {"harness": (replace(WORD_PERPLEXITY, header="WikiText (file format) word PPL"),
                         replace(HELDOUT_LOSS, header="WikiText (file format) loss/token"))},
            default=False)
