"""Evaluation and training text: local files laid out as ../shared/data, else the Hugging Face Hub.

Every loader returns plain dicts, already in the shape the harness's task config produces
(lm-evaluation-harness 0.4.x: lambada_openai, wikitext, hellaswag, arc_easy).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

DATA_ENV = "PREPROJ_DATA_DIR"

# task -> file (relative to the data dir) and the hub data set that holds the same items
LOCAL_FILES = {
    "lambada": "lambada/lambada_test.jsonl",
    "wikitext": "wikitext-2-raw/wiki.test.raw",
    "wikitext_valid": "wikitext-2-raw/wiki.valid.raw",
    "hellaswag": "hellaswag/hellaswag_val_subset1000.jsonl",
    "hellaswag_full": "hellaswag/hellaswag_val_full.txt",
    "arc_easy": "arc/ARC-Easy-Test.jsonl",
    "arc_easy_validation": "arc/ARC-Easy-Dev.jsonl",
    "wikitext2_train_tokens": "wikitext-2/wiki.train.tokens.xz",
}
HUB_SOURCES = {
    "lambada": ("EleutherAI/lambada_openai", "default", "test"),
    "wikitext": ("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test"),
    "wikitext_valid": ("Salesforce/wikitext", "wikitext-103-raw-v1", "validation"),
    "hellaswag": ("Rowan/hellaswag", None, "validation"),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "test"),
    "arc_easy_validation": ("allenai/ai2_arc", "ARC-Easy", "validation"),
}
HELLASWAG_FULL_NOTE = (
    "hellaswag_full uses llama.cpp's text format of all 10,042 items; its preprocessing differs slightly from the "
    "harness's (first letter of ctx_b not capitalised, a leading space left on 134/4000 endings), so scores match "
    "llama.cpp's HellaSwag, not the harness's to the decimal."
)


class DataNotFound(FileNotFoundError):
    """A named data set that is neither in the data directory nor reachable on the Hub."""


def resolve_data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """--data-dir, else $PREPROJ_DATA_DIR, else None (then the Hub is tried)."""
    value = explicit or os.environ.get(DATA_ENV)
    if value and not Path(value).is_dir():
        where = "--data-dir" if explicit else f"${DATA_ENV}"
        raise DataNotFound(f"{where} {str(value)!r} is not a directory; point it at a folder laid out as "
                           "../shared/data.")
    return Path(value) if value else None


def _local(name: str, data_dir: Path | None) -> Path | None:
    if data_dir is None:
        return None
    path = data_dir / LOCAL_FILES[name]
    return path if path.is_file() else None


def _local_only(name: str, key: str, data_dir: Path | None) -> DataNotFound:
    """A data set only a local data directory has (the Hub has no copy of it)."""
    where = (f"{data_dir} has no such file" if data_dir else
             f"no --data-dir given and ${DATA_ENV} is not set; point either at a folder laid out as ../shared/data")
    return DataNotFound(f"{name} needs {LOCAL_FILES[key]} in the data directory: {where}.")


def _hub(name: str, data_dir: Path | None):
    from .runtime import hub

    source = HUB_SOURCES.get(name)
    where = f"no file {data_dir / LOCAL_FILES[name]}" if data_dir else f"no --data-dir given and ${DATA_ENV} is not set"
    advice = (
        f"Data set {name!r} not found: {where}. Pass --data-dir (or set {DATA_ENV}) to a directory laid out "
        f"like ../shared/data (see its README)"
    )
    if source is None:
        raise DataNotFound(advice + ".")
    if not hub.reachable():
        raise DataNotFound(advice + f"; the Hub, which has {source[0]}, is unreachable.")
    try:
        import datasets
    except ImportError:
        raise DataNotFound(advice + f", or `pip install datasets` and go online to fetch {source[0]}.") from None
    try:
        return datasets.load_dataset(source[0], source[1], split=source[2])
    except Exception as e:  # offline, unknown repo, ...: the same advice either way
        raise DataNotFound(advice + f", or go online so `datasets` can fetch {source[0]} "
                                    f"({type(e).__name__}).") from None


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --- LAMBADA -------------------------------------------------------------------------------------

def lambada(data_dir: Path | None = None) -> list[dict]:
    """[{'text'}]: the OpenAI detokenised test set (lambada_openai), 5153 passages."""
    path = _local("lambada", data_dir)
    rows = _jsonl(path) if path else list(_hub("lambada", data_dir))
    return [{"text": r["text"]} for r in rows]


# --- WikiText ------------------------------------------------------------------------------------

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


def wikitext_documents(data_dir: Path | None = None) -> list[dict]:
    """[{'page'}]: WikiText-2 raw test, one document per article (62 of them)."""
    path = _local("wikitext", data_dir)
    if path:
        return [{"page": p} for p in split_articles(path.read_text(encoding="utf-8"))]
    return [{"page": r["page"]} for r in _hub("wikitext", data_dir)]


def wikitext_lines(split: str = "valid", data_dir: Path | None = None) -> list[str]:
    """Raw WikiText lines (valid = WikiText-2/103 raw validation, which are the same articles)."""
    name = "wikitext_valid" if split == "valid" else "wikitext"
    path = _local(name, data_dir)
    if path:
        return path.read_text(encoding="utf-8").split("\n")
    if name == "wikitext":
        return "\n".join(r["page"] for r in _hub(name, data_dir)).split("\n")
    return [r["text"] for r in _hub(name, data_dir)]


def wikitext_rows(split: str = "valid", data_dir: Path | None = None) -> list[str]:
    """The raw split as the Hub's wikitext-*-raw-v1 rows: one row per line of the file, each keeping its
    trailing newline, blank lines as ''."""
    path = _local("wikitext_valid" if split == "valid" else "wikitext", data_dir)
    if path:
        with open(path, encoding="utf-8", newline="") as f:
            return [row if row.strip() else "" for row in f]
    return [row if row.strip() else "" for row in wikitext_lines(split, data_dir)]


def wikitext_detokenize(text: str) -> str:
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


# --- HellaSwag -----------------------------------------------------------------------------------

def hellaswag_preprocess(text: str) -> str:
    """The harness's HellaSwag cleaning: WikiHow [title]/[step] artefacts out, double spaces collapsed."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _hellaswag_doc(r: dict) -> dict:
    ctx = r["ctx_a"] + " " + r["ctx_b"].capitalize()
    return {
        "query": hellaswag_preprocess(r["activity_label"] + ": " + ctx),
        "choices": [hellaswag_preprocess(e) for e in r["endings"]],
        "gold": int(r["label"]),
        "raw_ctx": r["ctx"],  # the paper protocol scores raw ctx + " " + ending
        "raw_endings": list(r["endings"]),
    }


def hellaswag(data_dir: Path | None = None, full: bool = False) -> list[dict]:
    """[{'query','choices','gold','raw_ctx','raw_endings'}]; full=True reads llama.cpp's 10,042-item file."""
    if full:
        return _hellaswag_full(data_dir)
    path = _local("hellaswag", data_dir)
    rows = _jsonl(path) if path else list(_hub("hellaswag", data_dir))
    return [_hellaswag_doc(r) for r in rows]


def _hellaswag_full(data_dir: Path | None) -> list[dict]:
    path = _local("hellaswag_full", data_dir)
    if path is None:
        raise _local_only("hellaswag_full", "hellaswag_full", data_dir)
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


def hellaswag_in_order(data_dir: Path | None = None) -> tuple[list[dict], str]:
    """The validation set in its original order with raw ctx and endings (the paper protocol's 'first 500'),
    and where it came from: the local full file, else the Hub."""
    if _local("hellaswag_full", data_dir) is None:
        return [_hellaswag_doc(r) for r in _hub("hellaswag", data_dir)], "HellaSwag validation (Hub), original order"
    docs = _hellaswag_full(data_dir)
    for doc in docs[:HELLASWAG_RAW_ITEMS]:
        doc["raw_ctx"] = doc["raw_ctx"].split(": ", 1)[1]
    return docs, (f"HellaSwag validation in original order from {LOCAL_FILES['hellaswag_full']}, raw ctx recovered by "
                  f"removing the activity label; exact for the first {HELLASWAG_RAW_ITEMS} items, beyond which "
                  "llama.cpp's preprocessing removed WikiHow's [tags]")


# --- ARC-Easy ------------------------------------------------------------------------------------

def arc_easy(data_dir: Path | None = None, split: str = "test") -> list[dict]:
    """[{'question','choices','gold'}] from AI2's JSONL (test = harness arc_easy, validation = the paper's)."""
    name = "arc_easy" if split == "test" else "arc_easy_validation"
    path = _local(name, data_dir)
    if path:
        rows = _jsonl(path)
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
        for r in _hub(name, data_dir)
    ]


# --- training text -------------------------------------------------------------------------------

def training_corpus(name: str, data_dir: Path | None = None, *,
                    lines: int | None = None) -> tuple[list[str], list[str], str]:
    """(train lines, held-out lines, description) for `preproj train --data NAME|FILE`.

    wikitext2: WikiText-2 raw valid for training, raw test held out (disjoint; the raw train split is
    not available offline). wikitext103: the paper's source, WikiText-103 raw train from the Hub, with
    its validation split held out. tinystories: the local TinyStories head (smoke tests). These named
    corpora keep the paper's WikiText rule (lines longer than 50 characters). Anything else is the user's
    own text as it is (user_text): every non-empty line, the last 5% held out.
    """
    if name == "wikitext2":
        train = wikitext_lines("valid", data_dir)
        held = wikitext_lines("test", data_dir)
        desc = ("WikiText-2 raw valid (train) / raw test (held out): disjoint; the raw train split is not available "
                "offline")
    elif name == "wikitext2-train":
        path = _local("wikitext2_train_tokens", data_dir)
        if path is None:
            raise _local_only("wikitext2-train", "wikitext2_train_tokens", data_dir)
        import lzma

        with lzma.open(path, "rt", encoding="utf-8") as f:
            train = f.read().split("\n")
        held = wikitext_lines("valid", data_dir)
        desc = ("WikiText-2 train, tokenized with <unk> for rare words (train) / raw valid (held out, for selection); "
                "raw test stays unseen for reporting")
    elif name == "wikitext103":
        try:
            import datasets as hf
            train = [r["text"] for r in hf.load_dataset("Salesforce/wikitext", "wikitext-103-raw-v1", split="train")]
        except Exception as e:
            raise DataNotFound(f"wikitext103 comes from the Hub (Salesforce/wikitext), which is not reachable here "
                               f"({type(e).__name__}); use --data wikitext2 offline.") from None
        held = wikitext_lines("valid", data_dir)
        desc = "WikiText-103 raw train (Hub) / WikiText-103 raw validation (held out)"
    else:
        path = Path(name)
        if name == "tinystories":
            if data_dir is None or not (data_dir / "tinystories/tinystories_validation_head.txt").is_file():
                raise DataNotFound("tinystories needs tinystories/tinystories_validation_head.txt in --data-dir.")
            path = data_dir / "tinystories/tinystories_validation_head.txt"
        if name != "tinystories":
            train, held, desc = user_text(path)
            return (train if lines is None else train[:lines]), held, desc
        all_lines = path.read_text(encoding="utf-8").split("\n")
        cut = int(len(all_lines) * 0.95)
        train, held = all_lines[:cut], all_lines[cut:]
        desc = f"{path.name}: first 95% of lines (train) / last 5% (held out)"
    train = [line for line in train if len(line.strip()) > 50]
    if lines is not None:
        train = train[:lines]
    return train, [line for line in held if len(line.strip()) > 50], desc


NAMED_CORPORA = ("wikitext2", "wikitext2-train", "wikitext103", "tinystories")


def check_data_source(name: str) -> None:
    """Fail before any model loads when --data names neither a corpus nor anything on disk."""
    if name not in NAMED_CORPORA and not Path(name).exists():
        raise _no_such_source(name)


def _no_such_source(name: str) -> DataNotFound:
    return DataNotFound(f"--data {name!r} is neither a known corpus ({', '.join(NAMED_CORPORA)}) nor a file or "
                        "directory.")


def _user_lines(path: Path) -> list[str]:
    """A user's text file as lines (a final newline ends the last line; it opens no blank one), or one line that says
    the file is not UTF-8, where, and how to convert it."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise DataNotFound(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} on line {line} is not valid "
                           f"UTF-8): convert it, for a Latin-1 file with `iconv -f latin1 -t utf-8 {path.name} > "
                           f"{path.stem}.utf8{path.suffix}`, and give --data the converted file.") from None
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def user_text(path: Path) -> tuple[list[str], list[str], str]:
    """(train lines, held-out lines, one line saying what was kept) from a user's own text, as it is: a text file, a
    JSON Lines file of {"text": ...} records, or a directory of .txt files (in name order). Every non-empty line
    is kept, whatever its length (dialogue, code, verse); the last 5% of them is held out."""
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise DataNotFound(f"--data {str(path)!r} is a directory without .txt files; give a file, a JSON Lines "
                               "file with a 'text' field, or a directory of .txt files.")
        raw = [line for f in files for line in _user_lines(f)]
        source = f"{path.name}/ ({len(files)} .txt files)"
    elif path.is_file() and path.suffix in (".jsonl", ".json"):
        raw = []
        for number, line in enumerate(_user_lines(path), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise DataNotFound(f"{path}:{number} is not JSON; a .jsonl file holds one {{\"text\": ...}} record per "
                                   "line.") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataNotFound(f"{path}:{number} has no 'text' string; a .jsonl file holds one {{\"text\": ...}} "
                                   "record per line.")
            raw += record["text"].split("\n")
        source = path.name
    elif path.is_file():
        raw = _user_lines(path)
        source = path.name
    else:
        raise _no_such_source(str(path))
    kept = [line for line in raw if line.strip()]
    if not kept:
        raise DataNotFound(f"--data {str(path)!r} has no text: every line is empty.")
    cut = len(kept) - max(1, len(kept) // 20) if len(kept) > 1 else len(kept)
    desc = (f"{source}: {len(kept):,} non-empty lines kept ({len(raw) - len(kept):,} blank dropped); the first "
            f"{cut:,} train, the last {len(kept) - cut:,} held out")
    return kept[:cut], kept[cut:], desc
