"""Start-up hook of every Python process a test (or a lane) starts, found through PYTHONPATH.

- ``PYTEST_CANARCHY_GUARD=1`` (set by canarchy's pytest plugin for isolated
  tests): the child gets its parent test's guards (:mod:`canarchy.testing.isolation._child`).
- ``PYTEST_CANARCHY_IMPORT_PROOF=DIR`` with ``PYTEST_CANARCHY_IMPORT_PACKAGES=a,b``
  (set by the mutation lane): the process writes ``DIR/<pid>-<package>.json``
  saying where it imports each package from, so the lane can prove every
  process tested the mutant; and ``DIR/starts-<pid>.jsonl``, one line per
  process it starts (the audit events of ``_STARTS``: command line and the
  environment's hook variables), so the lane can name a process that would
  not report (``python -I``, ``env={}``, a shell). Standard library only, and
  before anything else.

Runs once per process; the ``sitecustomize`` it shadows runs afterwards.
"""

import json
import os
import sys

_MARK = "_canarchy_sitecustomize_done"


def _command_line() -> list:
    try:  # the whole command line (sys.argv holds only "-c" for `python -c CODE` this early)
        with open("/proc/self/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return list(sys.argv)


def _record(directory: str, package: str, origin: str) -> None:
    path = os.path.join(directory, f"{os.getpid()}-{package}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"pid": os.getpid(), "ppid": os.getppid(), "argv": _command_line(), "cwd": os.getcwd(),
                       "package": package, "origin": origin}, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a process that cannot report is judged by the lane as one that did not report


class _ImportProof:
    """A meta path finder that notes where each watched top-level package is found."""

    def __init__(self, directory: str, packages: set) -> None:
        self.directory, self.packages = directory, packages

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.packages:
            self.packages.discard(fullname)
            spec = None
            for finder in sys.meta_path:  # what the import system will find after this finder
                find = getattr(finder, "find_spec", None) if finder is not self else None
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
            if spec is not None:
                origin = spec.origin if spec.origin not in (None, "namespace") else \
                    os.pathsep.join(spec.submodule_search_locations or [])
                _record(self.directory, fullname, origin or "?")
        return None


#: audit event -> positions of (program, argv, env) in its arguments; ``os.system`` has the command only.
_STARTS = {"subprocess.Popen": (0, 1, 3), "os.posix_spawn": (0, 1, 2), "os.spawn": (1, 2, 3),
           "os.exec": (0, 1, 2), "os.system": None}
_HOOK_VARIABLES = ("PYTHONPATH", "PYTEST_CANARCHY_IMPORT_PROOF", "PYTEST_CANARCHY_IMPORT_PACKAGES", "PATH")


def _text(value):
    return os.fsdecode(value) if isinstance(value, (str, bytes, os.PathLike)) else None


def _get(env, name):
    """``env[name]`` for str or bytes keys (``subprocess`` takes either); None if absent."""
    for key in (name, name.encode()):
        try:
            return env[key]
        except (KeyError, TypeError):
            continue
    return None


def _watch_starts(directory: str) -> None:
    """Note each process this one starts in ``DIR/starts-<pid>.jsonl`` (opened now: an audit hook must not open)."""
    try:
        fd = os.open(os.path.join(directory, f"starts-{os.getpid()}.jsonl"),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return  # the lane finds no file and judges this process as one that did not report

    def hook(event, args):
        if event not in _STARTS:
            return
        try:
            where = _STARTS[event]
            if where is None:
                program, argv, env = "/bin/sh", ["/bin/sh", "-c", _text(args[0]) or "?"], None
            else:
                program, argv, env = (args[i] for i in where)
                argv = [_text(a) or "?" for a in ([argv] if isinstance(argv, (str, bytes)) else argv or ())]
            given = env is not None
            env = os.environ if env is None else env
            seen = {name: _text(_get(env, name)) for name in _HOOK_VARIABLES}
            line = json.dumps({"pid": os.getpid(), "event": event, "program": _text(program), "argv": argv,
                               "cwd": _text(args[2]) if event == "subprocess.Popen" and args[2] is not None
                               else os.getcwd(), "env_given": given, "env": seen})
            os.write(fd, (line + "\n").encode())
        except Exception:  # a hook must never break the start of a test's process
            pass

    sys.addaudithook(hook)


def _import_proof() -> None:
    directory = os.environ.get("PYTEST_CANARCHY_IMPORT_PROOF")
    packages = {p for p in os.environ.get("PYTEST_CANARCHY_IMPORT_PACKAGES", "").split(",") if p}
    if not directory or not packages:
        return
    for name in sorted(packages):
        module = sys.modules.get(name)
        if module is not None:  # imported before this hook ran (a .pth file)
            _record(directory, name, getattr(module, "__file__", None) or "?")
    sys.meta_path.insert(0, _ImportProof(directory, {p for p in packages if p not in sys.modules}))
    _watch_starts(directory)


def _activate() -> None:
    if os.environ.get("PYTEST_CANARCHY_GUARD") != "1":
        return
    try:
        from canarchy.testing.isolation import _child
    except ImportError:  # a Python without canarchy has no python-can of ours to guard
        return
    _child.activate()


def _chain() -> None:
    """Run the sitecustomize that this one shadows (not another copy of this one)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    while True:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None or spec.origin is None:
            return
        origin_dir = os.path.dirname(os.path.abspath(spec.origin))
        if os.path.basename(origin_dir) == "_subprocess" and \
                os.path.isfile(os.path.join(os.path.dirname(origin_dir), "_child.py")):
            rest = [p for p in rest if os.path.abspath(p or os.curdir) != origin_dir]  # another canarchy hook
            continue
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return


if not getattr(sys, _MARK, False):
    setattr(sys, _MARK, True)
    _import_proof()
    _activate()
    _chain()
