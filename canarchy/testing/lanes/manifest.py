"""A manifest of a directory tree (the lanes' before/after checks).

Keys are relative POSIX paths; an entry records kind, size and the SHA-256 of
the content (files) or of the link target (links).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

#: Entries a checkout manifest leaves out: git's own data, the lanes' outputs,
#: virtualenvs and byte code (all ignored by git).
CHECKOUT_EXCLUDES = frozenset({".git", ".nox", "reports", ".venv", "__pycache__", "build", "dist"})


@dataclass(frozen=True)
class Entry:
    """One manifest entry: ``kind`` is ``file``, ``dir`` or ``link``; ``size`` in bytes;
    ``sha256`` of the content (files) or of the link target (links)."""

    kind: str
    size: int
    sha256: str


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest(root: str | os.PathLike[str], *, exclude: Iterable[str] = ()) -> dict[str, Entry]:
    """Describe every file, directory and symlink under ``root``.

    Keys are POSIX paths relative to ``root``; symlinks are recorded, never
    followed. Names in ``exclude`` are skipped wherever they occur (with
    everything under them). Raises ``FileNotFoundError`` if ``root`` is missing.
    """
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"{base}: not a directory")
    skipped = frozenset(exclude)
    result: dict[str, Entry] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in skipped)
        current = Path(dirpath)
        for name in list(dirnames):
            path = current / name
            rel = path.relative_to(base).as_posix()
            if path.is_symlink():
                dirnames.remove(name)  # os.walk does not follow it; record it as a link
                target = os.readlink(path)
                result[rel] = Entry("link", len(target), hashlib.sha256(target.encode()).hexdigest())
            else:
                result[rel] = Entry("dir", 0, "")
        for name in sorted(filenames):
            if name in skipped:
                continue
            path = current / name
            rel = path.relative_to(base).as_posix()
            if path.is_symlink():
                target = os.readlink(path)
                result[rel] = Entry("link", len(target), hashlib.sha256(target.encode()).hexdigest())
            elif path.is_file():
                result[rel] = Entry("file", path.stat().st_size, _sha256_file(path))
            else:  # socket, fifo: record that it exists
                result[rel] = Entry("other", 0, "")
    return result


def tree_manifest(root: str | os.PathLike[str]) -> dict[str, Entry]:
    """Manifest of a checkout, without :data:`CHECKOUT_EXCLUDES` and ``*.egg-info``."""
    entries = manifest(root, exclude=CHECKOUT_EXCLUDES)
    return {k: v for k, v in entries.items() if not any(part.endswith(".egg-info") for part in k.split("/"))}


def diff_manifests(before: Mapping[str, Entry], after: Mapping[str, Entry]) -> list[str]:
    """Differences as sorted lines: ``added: p``, ``removed: p``, ``changed: p (...)``; [] when equal."""
    lines: list[str] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if old is None:
            lines.append(f"added: {path}")
        elif new is None:
            lines.append(f"removed: {path}")
        elif old.kind != new.kind:
            lines.append(f"changed: {path} ({old.kind} -> {new.kind})")
        elif old.kind == "link":
            lines.append(f"changed: {path} (link target changed)")
        elif old.size != new.size:
            lines.append(f"changed: {path} ({old.size} -> {new.size} bytes)")
        else:
            lines.append(f"changed: {path} (same size, different content)")
    return lines


