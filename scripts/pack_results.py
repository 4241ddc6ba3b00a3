"""Keep results/ small: every committed per-item record and log (*.jsonl) becomes FILE.jsonl.xz, a compare run's
result.json drops the copy of its training log that train_log.jsonl holds, and results/MANIFEST.json lists the
SHA-256 and size of every committed file under results/.

preproj and the scripts read a packed file wherever they read the plain one (runtime.files.read_text;
scripts/recompute.py on its own), so a packed study reports, resumes and recomputes as before. Run it before
committing results, then commit what it changed; a live study's files (not yet committed) are left alone:

    python scripts/pack_results.py && git add -A results && git commit -m "results: ..."

tests/test_scripts.py checks that the manifest matches the committed files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
MANIFEST = RESULTS / "MANIFEST.json"
# What a clone's results/ may hold. Packing the per-item records and logs, dropping the training logs that
# result.json repeated, and 256-colour plots (analysis.plots.save_figure) brought 67 MB to 14.9 MB (issue 54 asked for
# under 15 MB); the confirmatory study's per-item records then added 4 MB, and the vision study's add about 12 (each
# MNIST run scores the 10,000 test digits twice, as drawn and shuffled, about 0.2 MB packed, and it makes 48 runs).
# A new study's records are what results/ is for; the budget keeps a clone small, not the evidence out.
BUDGET_BYTES = 35_000_000


def tracked(root: Path = ROOT) -> list[Path]:
    """The files under results/ that git tracks (committed or added), as they are on disk now."""
    names = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "results"], capture_output=True, check=True,
                           text=True).stdout.split("\0")
    return sorted(root / name for name in names if name and (root / name).is_file())


def pack(path: Path) -> Path:
    """FILE -> FILE.xz (deterministic: the same bytes give the same file), FILE removed once the copy reads back."""
    packed = path.with_name(path.name + ".xz")
    data = path.read_bytes()
    tmp = packed.with_name(packed.name + ".tmp")
    tmp.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    if lzma.decompress(tmp.read_bytes()) != data:
        tmp.unlink()
        raise SystemExit(f"{path}: its packed copy does not read back; nothing removed")
    os.replace(tmp, packed)
    path.unlink()
    return packed


def drop_repeated_log(result: Path) -> bool:
    """A compare run's result.json repeats its train_log.jsonl as "log": keep the log in the one file when the two
    are the same record for record (compare reads it back from there). True when the file was rewritten."""
    run = json.loads(result.read_text())
    log, packed = result.parent / "train_log.jsonl", result.parent / "train_log.jsonl.xz"
    text = log.read_text() if log.is_file() else lzma.decompress(packed.read_bytes()).decode() \
        if packed.is_file() else None
    if "log" not in run or text is None or [json.loads(line) for line in text.splitlines()] != run["log"]:
        return False
    run.pop("log")
    tmp = result.with_name(result.name + ".tmp")
    tmp.write_text(json.dumps(run, indent=2) + "\n")
    os.replace(tmp, result)
    return True


def manifest(files: list[Path], root: Path = ROOT) -> dict:
    return {str(f.relative_to(root)): {"sha256": hashlib.sha256(f.read_bytes()).hexdigest(), "bytes": f.stat().st_size}
            for f in sorted(files) if f.name != MANIFEST.name}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    files, packed = [], 0
    for path in tracked():
        if path.name == "result.json":
            packed += drop_repeated_log(path)
        if path.suffix == ".jsonl":
            path, packed = pack(path), packed + 1
        files.append(path)
    entries = manifest(files)
    MANIFEST.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    total = sum(e["bytes"] for e in entries.values())
    print(f"packed {packed} file(s); results/ holds {len(entries)} committed files, {total / 2**20:.1f} MiB "
          f"(MANIFEST.json); now git add -A results", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
