"""The data directory (local files laid out as ../shared/data, else the Hugging Face Hub), the training corpora and
a user's own text.

Each evaluation task reads its own items (evaluation/tasks/<name>/reader.py) through the lookups here: a `Source`
names a data set's file in the data directory and, where the Hub holds the same items, its repository. The WikiText
sources stay here because training reads them too (WikiText-2 raw valid and test for `--data wikitext2`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DATA_ENV = "PREPROJ_DATA_DIR"


@dataclass(frozen=True)
class Source:
    """A named data set: its file relative to the data directory and, where the Hub holds the same items, the
    (repository, config, split) that `datasets.load_dataset` takes."""

    name: str
    file: str
    hub: tuple[str, str | None, str] | None = None


WIKITEXT_TEST = Source("wikitext", "wikitext-2-raw/wiki.test.raw",
                       ("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test"))
WIKITEXT_VALID = Source("wikitext_valid", "wikitext-2-raw/wiki.valid.raw",
                        ("Salesforce/wikitext", "wikitext-103-raw-v1", "validation"))
WIKITEXT2_TRAIN_TOKENS = Source("wikitext2_train_tokens", "wikitext-2/wiki.train.tokens.xz")


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


def local_file(source: Source, data_dir: Path | None) -> Path | None:
    """The source's file in the data directory, or None where there is none."""
    if data_dir is None:
        return None
    path = data_dir / source.file
    return path if path.is_file() else None


def local_only(name: str, source: Source, data_dir: Path | None) -> DataNotFound:
    """A data set only a local data directory has (the Hub has no copy of it)."""
    where = (f"{data_dir} has no such file" if data_dir else
             f"no --data-dir given and ${DATA_ENV} is not set; point either at a folder laid out as ../shared/data")
    return DataNotFound(f"{name} needs {source.file} in the data directory: {where}.")


def hub_rows(source: Source, data_dir: Path | None):
    """The source's rows from the Hub, or DataNotFound saying where the data could have been found."""
    from .runtime import hub

    name = source.name
    where = f"no file {data_dir / source.file}" if data_dir else f"no --data-dir given and ${DATA_ENV} is not set"
    advice = (
        f"Data set {name!r} not found: {where}. Pass --data-dir (or set {DATA_ENV}) to a directory laid out "
        f"like ../shared/data (see its README)"
    )
    if source.hub is None:
        raise DataNotFound(advice + ".")
    repo, config, split = source.hub
    if not hub.reachable():
        raise DataNotFound(advice + f"; the Hub, which has {repo}, is unreachable.")
    try:
        import datasets
    except ImportError:
        raise DataNotFound(advice + f", or `pip install datasets` and go online to fetch {repo}.") from None
    try:
        return datasets.load_dataset(repo, config, split=split)
    except Exception as e:  # offline, unknown repo, ...: the same advice either way
        raise DataNotFound(advice + f", or go online so `datasets` can fetch {repo} "
                                    f"({type(e).__name__}).") from None


def jsonl_rows(path: Path) -> list[dict]:
    """The records of a JSON Lines file, blank lines skipped."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --- WikiText (training reads it too) -----------------------------------------------------------

def wikitext_lines(split: str = "valid", data_dir: Path | None = None) -> list[str]:
    """Raw WikiText lines (valid = WikiText-2/103 raw validation, which are the same articles)."""
    source = WIKITEXT_VALID if split == "valid" else WIKITEXT_TEST
    path = local_file(source, data_dir)
    if path:
        return path.read_text(encoding="utf-8").split("\n")
    if source is WIKITEXT_TEST:
        return "\n".join(r["page"] for r in hub_rows(source, data_dir)).split("\n")
    return [r["text"] for r in hub_rows(source, data_dir)]


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
        path = local_file(WIKITEXT2_TRAIN_TOKENS, data_dir)
        if path is None:
            raise local_only("wikitext2-train", WIKITEXT2_TRAIN_TOKENS, data_dir)
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
