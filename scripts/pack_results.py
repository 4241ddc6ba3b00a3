"""Keep results/ small: every committed per-item record and log (*.jsonl) becomes FILE.jsonl.xz, and
results/MANIFEST.json lists the SHA-256 and size of every committed file under results/.

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
# What a clone's results/ may hold. Issue 54 asks for under 15 MB; packing the per-item records and logs brought
# 67 MB to 16.8 MiB, and the rest (result.json files that repeat their run's log, two copies of one tokenizer, the
# plots) is not packed yet: this bound keeps it from growing while that is open.
BUDGET_BYTES = 17 * 2**20


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


def manifest(files: list[Path], root: Path = ROOT) -> dict:
    return {str(f.relative_to(root)): {"sha256": hashlib.sha256(f.read_bytes()).hexdigest(), "bytes": f.stat().st_size}
            for f in sorted(files) if f.name != MANIFEST.name}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    files, packed = [], 0
    for path in tracked():
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
