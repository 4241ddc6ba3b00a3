"""Files that are never half-written, journals that let a long computation resume, and run directories that one
process owns at a time."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path


class WriteFailed(OSError):
    """A file could not be written; the previous version of it, if any, is intact."""


def atomic_write(path: Path, write) -> None:
    """Write via a temporary file in the same directory and rename: readers never see half a file, and a
    failed write (a full disk, a vanished directory) leaves the previous file as it was."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise WriteFailed(e.errno, f"Could not write {path}: {e.strerror or e}") from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode a plain open() would
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        kept = "the previous version is intact" if path.exists() else "nothing was written"
        raise WriteFailed(e.errno, f"Could not write {path} ({e.strerror or e}); {kept}.") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def give_plain_modes(directory: Path) -> None:
    """mkdtemp makes a directory 0700 and safetensors its weights 0600: give a directory written whole and its files
    the modes that mkdir and open would, so that whoever the umask lets read a model directory can read it."""
    umask = _umask()
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        if path.is_dir():
            give_plain_modes(path)
        else:
            path.chmod(0o666 & ~umask)


def _umask() -> int:
    """The process's umask; reading it means setting it, so it is set straight back."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def write_json(path: str | os.PathLike, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2) + "\n"))


def write_jsonl(path: str | os.PathLike, records: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in records)))


class Journal:
    """The finished pieces of a long computation, one JSON line each, so that a stopped one resumes at the piece it
    was in. `key` names the computation (its inputs, the weights it ran on): pieces written under another key are
    not this computation's and are never returned. A line cut short by a crash is dropped when the journal is
    opened; the owner deletes the file once the whole result is safely written elsewhere."""

    def __init__(self, path: str | os.PathLike, key: str):
        self.path, self.key = Path(path), key
        text = self.path.read_text() if self.path.is_file() else ""
        lines = text.splitlines()
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:  # the last line of a process that died writing it
                continue
        entries = [e for e in entries if isinstance(e, dict)]
        self.done = {e["piece"]: e["value"] for e in entries if e.get("key") == key}
        if len(entries) < len(lines) or not text.endswith("\n"):  # a torn last line: appends start on a whole one
            write_jsonl(self.path, entries)

    def record(self, piece: int, value) -> None:
        """Keep `value` (anything JSON holds exactly: floats round-trip) as piece `piece`, on disk before returning."""
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": self.key, "piece": piece, "value": value}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done[piece] = value


class RunInUse(RuntimeError):
    """The run directory is owned by another live process."""


class RunLock:
    """Exclusive ownership of a run directory: DIR/.lock, held with flock for as long as this process runs.

    The kernel drops the lock when its owner exits, however it exits, so a crashed run leaves nothing
    stale behind and `--resume` just works. The file records the owner for the refusal message."""

    def __init__(self, directory: str | os.PathLike, command: str):
        self.path, self.command, self._fd, self._made = Path(directory) / ".lock", command, None, False

    def __enter__(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # no flock on this platform: runs are not protected from each other
            return self
        try:
            self._made = not self.path.parent.exists()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise WriteFailed(e.errno,
                              f"Cannot use {self.path.parent} as a run directory: {e.strerror or e}.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunInUse(f"{self.path.parent} is in use by {self._owner()}; wait for that run to finish or choose "
                           "another --out.") from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                 "started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
        self._fd = fd
        return self

    def _owner(self) -> str:
        try:
            o = json.loads(self.path.read_text())
            return f"{o['command']} (pid {o['pid']} on {o['host']}, started {o['started']})"
        except (OSError, ValueError, KeyError):
            return "another process"

    def __exit__(self, *exc) -> bool:
        if self._fd is not None:
            # A run that failed before writing anything leaves no directory it made: removed while still held, so
            # no other process can be writing there.
            if self._made and [p.name for p in self.path.parent.iterdir()] == [self.path.name]:
                self.path.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    self.path.parent.rmdir()
            os.close(self._fd)  # closing releases the flock; a file left stays, harmless, for the next owner
            self._fd = None
        return False


PACKED_SUFFIX = ".xz"
"""A committed study keeps its per-item records and logs xz-compressed (scripts/pack_results.py); readers take
FILE or, where only that is kept, FILE.xz, so a packed study reads as it was written."""


def kept(path: str | os.PathLike) -> Path | None:
    """`path` if it is a file, else its packed copy if that is, else None."""
    path = Path(path)
    if path.is_file():
        return path
    packed = path.with_name(path.name + PACKED_SUFFIX)
    return packed if packed.is_file() else None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON Lines file (or of its packed copy), as write_jsonl writes them."""
    return [json.loads(line) for line in read_text(path).splitlines()]


def read_text(path: str | os.PathLike) -> str:
    """The text of `path`, or of its packed copy where only that is kept (UTF-8 either way)."""
    import lzma

    found = kept(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no such file (nor {Path(path).name}{PACKED_SUFFIX} beside it)")
    if found.name.endswith(PACKED_SUFFIX):
        with lzma.open(found, "rt", encoding="utf-8") as f:
            return f.read()
    return found.read_text(encoding="utf-8")
