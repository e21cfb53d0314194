"""The processes of a mutation run that the import proof cannot follow.

The start-up hook (``isolation/_subprocess/sitecustomize.py``) notes each process a reporting Python process
starts (``starts-<pid>.jsonl`` in the proof directory). A Python started so that the hook never runs in it
(``-I``, ``-E``, ``-S``, an environment without the hook), a shell or ``env`` with options (either may start
such a Python unseen), or a script whose ``#!`` line does one of these, imports the project from wherever its
own ``sys.path`` leads and never reports: :func:`unseen` names each one and why.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from collections.abc import Sequence

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish", "csh", "tcsh"})
PYTHON = re.compile(r"(python|pypy)[0-9.]*[dmt]*(\.exe)?")
ISOLATING = {"I": "-I (isolated mode) ignores PYTHONPATH", "E": "-E ignores PYTHONPATH",
             "S": "-S skips the site module, and with it the hook"}
NEVER_RAN = "so the import-proof hook never ran in it and where it imported the project from is unknown"
SHELL = "a shell: a Python it starts, with -I or another environment, would not report to the import proof"


def load_starts(proof: Path) -> list[dict]:
    """Every start the hook noted under ``proof``; an unreadable line is kept as a start with no command line."""
    found: list[dict] = []
    for path in sorted(proof.glob("starts-*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                found.append({"argv": [], "torn": line[:120]})
    return found


def unseen(starts: Sequence[dict], *, proof: Path, packages: Sequence[str], hook_dir: Path) -> list[str]:
    """``command line: why`` for each start whose Python processes the import proof cannot see (once each)."""
    found: dict[str, str] = {}
    for start in starts:
        why = _why(start, str(proof), ",".join(packages), hook_dir)
        if why:
            command = " ".join(start.get("argv") or []) or f"? (torn record {start.get('torn', '')!r})"
            found.setdefault(command, f"{command[:200]}: {why}")
    return list(found.values())


def _name(program: str | None) -> str:
    return os.path.basename(program or "")


def _why(start: dict, proof: str, packages: str, hook_dir: Path, depth: int = 0) -> str | None:
    argv = [str(a) for a in start.get("argv") or []]
    if not argv:
        return "its start was noted but the record is unreadable"
    program = start.get("program") or argv[0]
    names = {_name(program), _name(argv[0])}
    if start.get("event") == "os.system" or names & SHELLS:
        return SHELL
    if any(PYTHON.fullmatch(n) for n in names):
        return _python_why(argv[1:], start, proof, packages, hook_dir)
    if "env" in names:
        return _env_why(argv[1:], start, proof, packages, hook_dir, depth)
    shebang = _shebang(program, start) if depth == 0 else None
    if shebang:
        script = dict(start, program=shebang[0], argv=[*shebang, program, *argv[1:]])
        why = _why(script, proof, packages, hook_dir, depth + 1)
        return f"a script run by `#!{' '.join(shebang)}`: {why}" if why else None
    for i, arg in enumerate(argv[1:], 1):  # a wrapper (timeout, nice, xargs ...) that runs a Python
        if PYTHON.fullmatch(_name(arg)):
            return _python_why(argv[i + 1:], start, proof, packages, hook_dir)
    return None


def _env_why(args: list[str], start: dict, proof: str, packages: str, hook_dir: Path, depth: int) -> str | None:
    """``env [NAME=VALUE ...] [OPTION ...] PROGRAM ...``: options or assignments may drop the hook."""
    rest = list(args)
    if len(rest) > 1 and rest[0] in ("-S", "--split-string"):  # `#!/usr/bin/env -S python3 -I`
        rest = [*rest[1].split(), *rest[2:]]
    if rest and (rest[0].startswith("-") or "=" in rest[0]):
        return f"`env {' '.join(rest[:3])}` may start a Python in another environment, which would not report"
    if not rest:
        return None
    return _why(dict(start, program=rest[0], argv=rest), proof, packages, hook_dir, depth)


def _python_why(options: list[str], start: dict, proof: str, packages: str, hook_dir: Path) -> str | None:
    flags = _isolating_options(options)
    if flags:
        return "; ".join(ISOLATING[f] for f in flags) + ", " + NEVER_RAN
    env = start.get("env") or {}
    missing = []
    if env.get("PYTEST_CANARCHY_IMPORT_PROOF") != proof or env.get("PYTEST_CANARCHY_IMPORT_PACKAGES") != packages:
        missing.append("PYTEST_CANARCHY_IMPORT_PROOF/_PACKAGES")
    entries = [e for e in (env.get("PYTHONPATH") or "").split(os.pathsep) if e]
    hook = next((i for i, e in enumerate(entries) if _same(e, hook_dir, start)), None)
    if hook is None:
        missing.append(f"PYTHONPATH with {hook_dir}")
    elif any(_has_sitecustomize(e, start) for e in entries[:hook]):
        missing.append(f"PYTHONPATH with {hook_dir} before any other sitecustomize")
    if not missing:
        return None
    given = "the environment it was given" if start.get("env_given") else "its environment"
    return f"{given} lacks {' and '.join(missing)}, {NEVER_RAN}"


def _isolating_options(args: list[str]) -> list[str]:
    """The interpreter options among I, E, S before the script, ``-c`` or ``-m`` (short options may cluster)."""
    found: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-", "--") or not arg.startswith("-"):
            break
        if arg.startswith("--"):
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        body = arg[1:]
        for j, char in enumerate(body):
            if char in ISOLATING and char not in found:
                found.append(char)
            if char in "cm":
                return found
            if char in "WX":
                i += 1 if j == len(body) - 1 else 0  # the value is the next argument
                break
        i += 1
    return found


def _absolute(path: str, start: dict) -> str:
    return os.path.normpath(os.path.join(start.get("cwd") or "/", path))


def _same(entry: str, hook_dir: Path, start: dict) -> bool:
    """``entry`` is the hook's directory, or holds the same hook (the plugin puts the copy's own first)."""
    where = os.path.realpath(_absolute(entry, start))
    if where == os.path.realpath(hook_dir):
        return True
    try:
        with open(os.path.join(where, "sitecustomize.py"), "rb") as theirs, \
                open(hook_dir / "sitecustomize.py", "rb") as ours:
            return theirs.read() == ours.read()
    except OSError:
        return False


def _has_sitecustomize(entry: str, start: dict) -> bool:
    where = os.path.join(_absolute(entry, start), "sitecustomize")
    return os.path.exists(where + ".py") or os.path.isdir(where)


def _shebang(program: str, start: dict) -> list[str] | None:
    """The ``#!`` line of ``program`` (found as the kernel would, through the start's PATH), split; None if none."""
    if "/" in program:
        candidates = [_absolute(program, start)]
    else:
        path = (start.get("env") or {}).get("PATH") or os.defpath
        candidates = [os.path.join(_absolute(d or ".", start), program) for d in path.split(os.pathsep)]
    for candidate in candidates:
        try:
            with open(candidate, "rb") as fh:
                head = fh.read(256)
        except OSError:
            continue
        if not head.startswith(b"#!"):
            return None
        return head[2:].split(b"\n", 1)[0].decode(errors="replace").split() or None
    return None
