"""Whether a byte-code file holds the compilation of its source: CPython's own cache
(``__pycache__/NAME.TAG[.opt-N].pyc``) or pytest's assertion rewrite
(``__pycache__/NAME.TAG-pytest-VERSION.pyc``). The compiler, ``marshal.loads`` and
``ast.parse`` and pytest's ``rewrite_asserts`` are bound when this module is imported (by the
plugin, before any test could replace them).
Design: docs/design/test-isolation.md (layer 6, byte code).
"""

from __future__ import annotations

import ast
import importlib.util
import marshal
import os
import sys
from typing import Any

from _pytest.assertion.rewrite import rewrite_asserts as _REWRITE

_COMPILE = compile
_LOADS = marshal.loads
_PARSE = ast.parse
_MAGIC = importlib.util.MAGIC_NUMBER
_TAG = sys.implementation.cache_tag
_HEADER = 16  # magic, flags, then mtime and size or a source hash (PEP 552)


def _expected(source: str, kind: str, optimize: int, config: Any) -> Any:
    """The code object the import system (``cpython``) or pytest's rewrite (``pytest``) makes of ``source``."""
    with open(source, "rb") as fh:
        text = fh.read()
    if kind == "cpython":
        return _COMPILE(text, source, "exec", dont_inherit=True, optimize=optimize)
    tree = _PARSE(text, filename=source)
    _REWRITE(tree, text, source, config)
    return _COMPILE(tree, source, "exec", dont_inherit=True)


def _source_and_kind(path: str) -> tuple[str, str, int] | None:
    """``(source, "cpython" or "pytest", optimization level)`` for a byte-code file name, or None."""
    directory, name = os.path.split(path)
    if os.path.basename(directory) != "__pycache__" or not name.endswith(".pyc"):
        return None
    stem, _, rest = name[:-len(".pyc")].partition(f".{_TAG}")
    source = os.path.join(os.path.dirname(directory), stem + ".py")
    if rest == "":
        return source, "cpython", 0
    if rest in (".opt-1", ".opt-2"):
        return source, "cpython", int(rest[-1])
    if rest.startswith("-pytest-"):
        return source, "pytest", 0
    return None


def signature(st: Any) -> tuple[int, int, int, int]:
    """What says a byte-code file is still the one compared: ``(size, mtime_ns, ctime_ns, inode)`` of an
    ``os.stat_result`` or a :class:`~canarchy.testing.isolation.tree.Entry` (a write in place that keeps
    size and mtime still moves the ctime, which no caller sets)."""
    if hasattr(st, "st_size"):
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino
    return st.size, st.mtime_ns, st.ctime_ns, st.inode


def mismatch(path: str, config: Any = None) -> str | None:
    """Why the byte code at ``path`` is not what compiling its source gives (a reason in words),
    or None when it is, or when there is nothing to judge (the file is gone: a temporary name)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    named = _source_and_kind(path)
    if named is None:
        return "not a byte-code file name the import system writes"
    source, kind, optimize = named
    if not os.path.exists(source):
        return None  # no import loads cached byte code without its source
    if data[:4] != _MAGIC:
        return "not this interpreter's byte code"
    try:
        found = _LOADS(data[_HEADER:])
    except (EOFError, ValueError, TypeError) as exc:
        return f"unreadable ({exc})"
    try:
        expected = _expected(source, kind, optimize, config)
    except (OSError, SyntaxError, ValueError) as exc:
        return f"its source {source} does not compile here ({exc.__class__.__name__})"
    if found != expected:
        return f"not the compilation of {source}"
    return None
