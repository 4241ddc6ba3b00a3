"""WikiText-2's items: the raw test split as documents (the harness), the raw validation split as rows (the paper),
and the harness's detokenizer. The files and raw lines themselves are data.py's, which training reads too."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ....data import WIKITEXT_TEST, WIKITEXT_VALID, hub_rows, local_file, wikitext_lines


def _is_article_title(line: str) -> bool:
    # " = Title = " starts an article; " = = Section = = " (level 2+) does not.
    squeezed = line.replace("= = =", "===").replace("= =", "==").strip()
    return squeezed.startswith("= ") and squeezed.endswith(" =")


def split_articles(raw: str) -> list[str]:
    """Split raw WikiText into articles at level-1 headings, as EleutherAI/wikitext_document_level does."""
    pages, current = [], []
    for line in raw.split("\n"):
        if _is_article_title(line):
            page = "\n".join(current)
            if page.strip():
                pages.append(page)
            current = []
        current.append(line)
    pages.append("\n".join(current))
    return pages


def documents(data_dir: Path | None = None) -> list[dict]:
    """[{'page'}]: WikiText-2 raw test, one document per article (62 of them)."""
    path = local_file(WIKITEXT_TEST, data_dir)
    if path:
        return [{"page": p} for p in split_articles(path.read_text(encoding="utf-8"))]
    return [{"page": r["page"]} for r in hub_rows(WIKITEXT_TEST, data_dir)]


def rows(split: str = "valid", data_dir: Path | None = None) -> list[str]:
    """The raw split as the Hub's wikitext-*-raw-v1 rows: one row per line of the file, each keeping its
    trailing newline, blank lines as ''."""
    path = local_file(WIKITEXT_VALID if split == "valid" else WIKITEXT_TEST, data_dir)
    if path:
        with open(path, encoding="utf-8", newline="") as f:
            return [row if row.strip() else "" for row in f]
    return [row if row.strip() else "" for row in wikitext_lines(split, data_dir)]


def detokenize(text: str) -> str:
    """The harness's wikitext detokenizer (lm_eval/tasks/wikitext/preprocess_wikitext.py)."""
    s = text.replace("s '", "s'")
    s = re.sub(r"/' [0-9]/", r"/'[0-9]/", s)
    for a, b in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" : ", ": "), (" ; ", "; "), (" . ", ". "),
                 (" ! ", "! "), (" ? ", "? "), (" , ", ", ")):
        s = s.replace(a, b)
    s = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", s)
    s = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', s)
    s = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", s)
    for a, b in (("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" \u00b0 ", "\u00b0"), (" \n", "\n"),
                 ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")):
        s = s.replace(a, b)
    return s


def harness_file(folder: Path, data_dir: Path, limit: int | None = None) -> Path:
    """The raw test split as one page per article (EleutherAI/wikitext_document_level's rows), which its
    harness.yaml reads, written into folder; `limit` keeps the first N pages (base.HarnessCopy)."""
    out = folder / "pages.jsonl"
    with open(out, "w") as f:
        for page in split_articles((data_dir / WIKITEXT_TEST.file).read_text())[:limit]:
            f.write(json.dumps({"page": page}) + "\n")
    return out
