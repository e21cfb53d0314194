import canarchy.testing.required  # noqa: F401

# The one tree manifest (canarchy.testing.isolation.tree) and its benchmark's code. Each test
# builds its trees under tmp_path; nothing here times anything (the figures are in
# `nox -s bench`, section sentinel).

import builtins
import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from benchmarks import sentinel
from canarchy.testing.isolation import tree
from canarchy.testing.isolation.checkout import checkout_state

GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(cwd: Path, *args: str) -> str:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, **GIT_ENV}
    proc = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                          env=env, check=True, capture_output=True, text=True, timeout=60)
    return proc.stdout


def make_repo(root: Path, files: dict[str, str], gitignore: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", ".")
    if gitignore:
        (root / ".gitignore").write_text(gitignore)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "start")
    return root


def work_tree(state: dict) -> dict:
    """A checkout state without git's own entries (``.git:HEAD``, ``.git:staged/...``, ``.git/config``, hooks)."""
    return {path: entry for path, entry in state.items() if not path.startswith(".git")}


def settle() -> None:
    """Let the kernel's file-time clock move on: before Linux 6.13, ctime is stamped from a
    clock that advances once per tick, so a write in the tick a file was made in could keep
    its ctime (the sentinel's files are older than the run; a test's are not)."""
    time.sleep(0.025)


@contextlib.contextmanager
def recorded_calls(monkeypatch: pytest.MonkeyPatch):
    """Every path os.scandir, os.lstat and os.stat are called with, while the block runs (the
    isolation's access guard, which would judge each listing the spy makes with calls of its own, is
    off meanwhile: exempting the thread would not do, the spy being a test's code)."""
    from canarchy.testing.isolation.access import GUARD

    seen: list[str] = []
    with monkeypatch.context() as m:
        for name in ("scandir", "lstat", "stat"):
            real = getattr(os, name)

            def spy(path, *args, _real=real, **kwargs):
                seen.append(os.fsdecode(path) if not isinstance(path, int) else f"fd {path}")
                return _real(path, *args, **kwargs)

            m.setattr(os, name, spy)
        GUARD.enabled = False
        try:
            yield seen
        finally:
            GUARD.enabled = True


def run_with_deadline(function, seconds: float = 10.0, fifos: tuple[Path, ...] = ()):
    """Run ``function`` in a thread; if it is still running after ``seconds`` (it opened a FIFO
    and waits for a writer), open the FIFOs for writing so it can finish, and fail."""
    result: dict[str, object] = {}

    def target() -> None:
        try:
            result["value"] = function()
        except BaseException as exc:  # reported below
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(seconds)
        pytest.fail(f"{function} blocked: it opened a FIFO")
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["value"]


# --------------------------------------------------------------------------- every kind of change


@pytest.fixture(params=["git", "plain"])
def checkout(request, tmp_path: Path) -> Path:
    """A small tree, once as a git checkout (snapshot asks git) and once as a plain directory."""
    files = {"keep.txt": "same\n", "gone.txt": "bye\n", "grow.txt": "a", "quiet.txt": "aaaa",
             "script.sh": "echo\n", "becomes_dir": "file\n", "pkg/mod.py": "x = 1\n"}
    root = tmp_path / "checkout"
    if request.param == "git":
        make_repo(root, files)
    else:
        root.mkdir()
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
    os.chmod(root / "script.sh", 0o644)
    os.symlink("keep.txt", root / "link")
    if request.param == "git":
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "link")
    settle()
    return root


#: What :func:`change_every_kind` does, as a metadata walk reports it (in path order).
EVERY_KIND_BY_METADATA = [
    "removed: gone.txt",
    "changed: grow.txt (size 1 -> 3)",
    "changed: link (link target keep.txt -> grow.txt)",
    "added: new.txt",
    "changed: quiet.txt (content or metadata)",
    "changed: script.sh (mode 644 -> 755)",
]


def change_every_kind(checkout: Path) -> None:
    """Add, remove, grow, rewrite in place (times put back), chmod and re-point a link in ``checkout``."""
    (checkout / "new.txt").write_text("hello\n")
    (checkout / "gone.txt").unlink()
    (checkout / "grow.txt").write_text("abc")
    quiet = checkout / "quiet.txt"
    stamp = quiet.stat()
    quiet.write_text("bbbb")  # same size, and the times put back: only ctime can tell
    os.utime(quiet, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert quiet.stat().st_mtime_ns == stamp.st_mtime_ns
    os.chmod(checkout / "script.sh", 0o755)
    (checkout / "link").unlink()
    os.symlink("grow.txt", checkout / "link")


def test_every_kind_of_change_is_reported(checkout: Path):
    before = tree.snapshot(checkout)
    assert tree.changes(before, tree.snapshot(checkout)) == []
    assert before["keep.txt"].kind == "file" and before["pkg"].kind == "dir" and before["link"].kind == "link"

    change_every_kind(checkout)
    (checkout / "becomes_dir").unlink()
    (checkout / "becomes_dir").mkdir()
    (checkout / "becomes_dir" / "inner.txt").write_text("in\n")

    assert tree.changes(before, tree.snapshot(checkout)) == [  # in path order
        "changed: becomes_dir (file -> dir)", "added: becomes_dir/inner.txt", *EVERY_KIND_BY_METADATA]


def test_the_checkout_state_sees_every_kind_of_change_from_git_s_index(checkout: Path):
    """The sentinel's view: a clean tracked file is not recorded at all (git compares its
    metadata with the index), so a change to it shows up as a new entry against the index."""
    before = checkout_state(checkout)
    if (checkout / ".git").exists():
        # a clean checkout: nothing of the work tree to record but what an import finds at its top, by metadata
        assert sorted(work_tree(before)) == ["pkg"], before
        assert before[".git:HEAD"].target and ".git/config" in before and ".git/hooks" in before, before
    (checkout / "dirty.txt").write_text("untracked before the run\n")
    before = checkout_state(checkout)
    assert tree.changes(before, checkout_state(checkout)) == []

    (checkout / "dirty.txt").write_text("written again\n")
    change_every_kind(checkout)

    found = tree.changes(before, checkout_state(checkout))
    if (checkout / ".git").exists():
        assert found == [
            "changed: dirty.txt (size 25 -> 14)",
            "removed: gone.txt",
            f"changed: grow.txt ({tree.INDEX_DIFFERS})",
            f"changed: link ({tree.INDEX_DIFFERS})",
            "added: new.txt",
            f"changed: quiet.txt ({tree.INDEX_DIFFERS})",
            f"changed: script.sh ({tree.INDEX_DIFFERS})",
        ]
    else:  # no git: the skip-list walk, as snapshot()
        assert found == ["changed: dirty.txt (size 25 -> 14)", *EVERY_KIND_BY_METADATA]


def test_the_checkout_state_reads_no_clean_file_and_walks_no_ignored_directory(tmp_path: Path, monkeypatch):
    """Its cost follows what changed: no clean tracked file is stat'ed by Python, none is opened."""
    repo = make_repo(tmp_path / "repo", {f"src/m{i}.py": "x\n" for i in range(50)}, gitignore="/venv/\n")
    (repo / "venv" / "lib").mkdir(parents=True)
    (repo / "venv" / "lib" / "site.py").write_text("ignored\n")
    (repo / "src" / "m7.py").write_text("changed before the run\n")
    settle()
    with recorded_calls(monkeypatch) as seen, monkeypatch.context() as m:
        opened: list[str] = []
        real_open = builtins.open
        m.setattr(builtins, "open", lambda f, *a, **k: opened.append(os.fsdecode(f)) or real_open(f, *a, **k))
        state = checkout_state(repo)
    assert sorted(work_tree(state)) == ["src", "src/m7.py", "venv"] and state["src/m7.py"].note == tree.TRACKED
    # one file stat'ed; a listing of the top (start-up code is looked for there, ignored or not), each directory
    # there stat'ed (an import finds a package in it) and probed: is it a package (where an import would find
    # byte code) or a virtual environment; nothing listed below; git's rules in each directory of its view; the
    # byte-code cache beside the sources (one directory of them); and what of .git a later git runs
    probes = sorted(path for path in seen if path.endswith(("/__init__.py", "/pyvenv.cfg")))
    rules = sorted(path for path in seen if path.endswith(tree.GIT_RULES))
    git_dir = str(repo / ".git")
    assert sorted({p for p in seen if p not in probes + rules and not p.startswith(git_dir)}) == [
        str(repo), str(repo / "src"), str(repo / "src" / "__pycache__"), str(repo / "src" / "m7.py"),
        str(repo / "venv")], seen
    assert rules == [str(repo / d / n) for d in ("", "src") for n in sorted(tree.GIT_RULES)], seen
    assert probes == [str(repo / d / n) for d in ("src", "venv") for n in ("__init__.py", "pyvenv.cfg")]
    assert opened == []


def test_the_checkout_state_of_an_ignored_directory_or_without_git_is_the_skip_list_walk(tmp_path: Path,
                                                                                         monkeypatch):
    repo = make_repo(tmp_path / "repo", {"a.py": "a\n"}, gitignore="/data/\n")
    (repo / "data" / "sub").mkdir(parents=True)
    (repo / "data" / "sub" / "f.txt").write_text("x\n")
    assert sorted(checkout_state(repo / "data")) == ["sub", "sub/f.txt"]  # git sees nothing here
    assert sorted(work_tree(checkout_state(repo))) == ["a.py", "data"]  # at the top, by metadata only
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert sorted(checkout_state(repo)) == [".gitignore", "a.py", "data", "data/sub", "data/sub/f.txt"]


def test_a_file_replaced_by_another_of_the_same_size_and_times_is_reported(tmp_path: Path):
    (tmp_path / "f.txt").write_text("1234")
    settle()
    before = tree.snapshot(tmp_path)
    stamp = (tmp_path / "f.txt").stat()
    (tmp_path / "new.txt").write_text("5678")
    os.utime(tmp_path / "new.txt", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    os.replace(tmp_path / "new.txt", tmp_path / "f.txt")
    assert tree.changes(before, tree.snapshot(tmp_path)) == ["changed: f.txt (replaced (new inode))"]


def test_a_link_made_to_a_file_from_elsewhere_is_no_change_of_it(tmp_path: Path):
    """uv installs a virtualenv's files as hard links to its cache: another install elsewhere links them
    again, which moves their ctime. A file with several links is compared without its ctime; a file that
    gains its second link is still a change."""
    (tmp_path / "tree").mkdir()
    (tmp_path / "cache").mkdir()
    linked, alone = tmp_path / "tree" / "METADATA", tmp_path / "tree" / "alone.txt"
    linked.write_text("Name: x\n")
    os.link(linked, tmp_path / "cache" / "first")
    alone.write_text("1234")
    settle()
    before = tree.snapshot(tmp_path / "tree")
    os.link(linked, tmp_path / "cache" / "second")  # another install elsewhere
    os.remove(tmp_path / "cache" / "first")         # a cache cleaned elsewhere
    assert tree.changes(before, tree.snapshot(tmp_path / "tree")) == []
    os.link(alone, tmp_path / "cache" / "alone")  # 1 -> 2 links: its ctime moved, and it is shown
    assert tree.changes(before, tree.snapshot(tmp_path / "tree")) == ["changed: alone.txt (content or metadata)"]


def test_files_made_in_a_watched_directory_but_not_watched_change_nothing(tmp_path: Path):
    """A directory's own times move with every name made in it: they are not compared, so
    byte code written beside a tracked module is not a change of its directory."""
    repo = make_repo(tmp_path / "repo", {"pkg/mod.py": "x = 1\n"}, gitignore="__pycache__/\n")
    plain = tmp_path / "plain"
    (plain / "pkg").mkdir(parents=True)
    (plain / "pkg" / "mod.py").write_text("x = 1\n")
    for root in (repo, plain):
        before = tree.snapshot(root)
        old = os.stat(root / "pkg").st_mtime_ns
        settle()
        (root / "pkg" / "__pycache__").mkdir()
        (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
        assert os.stat(root / "pkg").st_mtime_ns != old
        assert tree.changes(before, tree.snapshot(root)) == [], root


# --------------------------------------------------------------------------- what is walked


def test_an_ignored_directory_is_never_walked(tmp_path: Path, monkeypatch):
    repo = make_repo(tmp_path / "repo", {"src/a.py": "a\n"}, gitignore="/venv/\n*.log\n")
    for where in ("venv/lib/x.py", "venv/bin/python", "by-exclude/y.txt", "src/debug.log"):
        (repo / where).parent.mkdir(parents=True, exist_ok=True)
        (repo / where).write_text("ignored\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("/by-exclude/\n")

    with recorded_calls(monkeypatch) as seen:
        snap = tree.snapshot(repo)
    assert sorted(snap) == [".gitignore", "src", "src/a.py"]
    touched = [p for p in seen if "venv" in p or "by-exclude" in p or p.endswith(".log")]
    assert touched == []
    assert seen, "the spy saw no call: the test would prove nothing"


def test_untracked_files_that_are_not_ignored_are_included(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"sub/tracked.py": "t\n", "top.txt": "x\n"}, gitignore="*.tmp\n")
    (repo / "sub" / "deep" / "er").mkdir(parents=True)
    (repo / "sub" / "deep" / "er" / "untracked.py").write_text("u\n")
    (repo / "sub" / "scratch.tmp").write_text("ignored\n")
    nested = repo / "sub" / "vendored"
    make_repo(nested, {"inner.txt": "i\n"})

    snap = tree.snapshot(repo / "sub")  # root inside a work tree: paths relative to it
    assert sorted(snap) == ["deep", "deep/er", "deep/er/untracked.py", "tracked.py", "vendored"]
    assert snap["vendored"].kind == "dir"
    before = snap
    (repo / "sub" / "deep" / "more.py").write_text("m\n")
    assert tree.changes(before, tree.snapshot(repo / "sub")) == ["added: deep/more.py"]


def test_git_looks_at_the_work_tree_around_root_whatever_git_dir_says(tmp_path: Path, monkeypatch):
    repo = make_repo(tmp_path / "repo", {"mine.txt": "m\n"})
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("secret.txt\n")
    (repo / "secret.txt").write_text("s\n")
    other = make_repo(tmp_path / "other", {"other.txt": "o\n"})
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    assert sorted(tree.snapshot(repo)) == ["mine.txt"]


SKIPPED_EXAMPLES = [
    ".git/HEAD", ".hg/store", ".nox/unit/x", ".tox/py311/x", "pkg/__pycache__/m.pyc", ".pytest_cache/v",
    ".mypy_cache/v", ".ruff_cache/v", "canarchy.egg-info/PKG-INFO", "node_modules/a/index.js", "build/lib/x",
    "dist/x.whl", "reports/unit.xml", "myenv/pyvenv.cfg", "myenv/lib/site.py",
]


def test_outside_git_the_skip_list_is_used(tmp_path: Path, monkeypatch):
    root = tmp_path / "plain"
    for name in SKIPPED_EXAMPLES + ["pkg/mod.py", "docs/build.md", "dist.txt"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x\n")
    (root / "notes").mkdir()
    (root / "notes" / "build").write_text("a file named like a skipped directory\n")

    with recorded_calls(monkeypatch) as seen:
        snap = tree.snapshot(root)
    assert sorted(snap) == ["dist.txt", "docs", "docs/build.md", "notes", "notes/build", "pkg", "pkg/mod.py"]
    # Listed: the root, the kept directories, and the virtualenv's top (to find pyvenv.cfg); nothing else.
    assert sorted(seen) == sorted(str(root / d) if d else str(root) for d in ("", "docs", "notes", "pkg", "myenv"))

    whole = tree.snapshot(root, walk=tree.WHOLE)
    assert set(SKIPPED_EXAMPLES) <= set(whole)


def test_without_git_a_checkout_falls_back_to_the_skip_list(tmp_path: Path, monkeypatch):
    repo = make_repo(tmp_path / "repo", {"a.py": "a\n"}, gitignore="/data/\n")
    (repo / "data").mkdir()
    (repo / "data" / "big.csv").write_text("1,2\n")
    assert "data/big.csv" not in tree.snapshot(repo)
    empty_path = tmp_path / "no-git-here"
    empty_path.mkdir()
    monkeypatch.setenv("PATH", str(empty_path))
    snap = tree.snapshot(repo)
    assert "data/big.csv" in snap and "a.py" in snap
    assert not any(name.startswith(".git/") or name == ".git" for name in snap)


def test_operator_state_is_watched_whole_and_alone(tmp_path: Path):
    home = tmp_path / "home"
    for name in (".canarchy/config.toml", ".canarchy/build/x", ".canarchy/__pycache__/y.pyc",
                 ".canrc", ".bashrc", "notes/todo"):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text("x\n")
    snap = tree.snapshot(home, only=tree.OPERATOR_STATE)
    assert sorted(snap) == [".canarchy", ".canarchy/__pycache__", ".canarchy/__pycache__/y.pyc",
                            ".canarchy/build", ".canarchy/build/x", ".canarchy/config.toml", ".canrc"]
    (home / "can.conf").write_text("[default]\n")
    (home / ".bashrc").write_text("changed\n")
    assert tree.changes(snap, tree.snapshot(home, only=tree.OPERATOR_STATE)) == ["added: can.conf"]
    assert tree.snapshot(tmp_path / "missing") == {}
    assert tree.snapshot(tmp_path / "missing", only=tree.OPERATOR_STATE) == {}
    with pytest.raises(ValueError, match="walk must be one of"):
        tree.snapshot(home, walk="everything")


# --------------------------------------------------------------------------- nothing is read, nothing followed


def test_a_2_gib_sparse_file_is_recorded_without_being_opened(tmp_path: Path, monkeypatch):
    home = tmp_path / "home"
    (home / ".canarchy").mkdir(parents=True)
    big = home / ".canarchy" / "capture.bin"
    with open(big, "wb") as fh:
        fh.truncate(2 << 30)
    if big.stat().st_blocks * 512 > 1 << 20:
        pytest.skip("this file system does not keep sparse files")

    def refuse(*args, **kwargs):
        raise AssertionError(f"snapshot opened {args[0]!r}")

    with monkeypatch.context() as m:
        for module, name in ((builtins, "open"), (io, "open"), (os, "open")):
            m.setattr(module, name, refuse)
        snap = tree.snapshot(home, only=tree.OPERATOR_STATE)
    assert snap[".canarchy/capture.bin"].size == 2 << 30


def test_fifos_are_recorded_not_opened(tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"a.py": "a\n"})
    home = tmp_path / "home"
    (home / ".canarchy").mkdir(parents=True)
    fifos = (repo / "pipe", home / ".canarchy" / "pipe", tmp_path / "plain" / "pipe")
    fifos[2].parent.mkdir()
    for fifo in fifos:
        os.mkfifo(fifo)
    snaps = run_with_deadline(lambda: (tree.snapshot(repo), tree.snapshot(home, only=tree.OPERATOR_STATE),
                                       tree.snapshot(fifos[2].parent)), fifos=fifos)
    assert "a.py" in snaps[0]  # git lists no FIFO: nothing to open there either
    assert snaps[1][".canarchy/pipe"].kind == snaps[2]["pipe"].kind == "other"
    with pytest.raises(OSError, match="not a regular file"):
        run_with_deadline(lambda: tree.content_digest(fifos[2]), fifos=fifos)
    copy = tmp_path / "copy"
    copy.mkdir()
    os.mkfifo(copy / "pipe")
    assert run_with_deadline(lambda: tree.content_differences(fifos[2].parent, copy),
                             fifos=(fifos[2], copy / "pipe")) == []


@pytest.mark.parametrize("kind", ["git", "plain"])
def test_symlinks_are_recorded_never_followed(tmp_path: Path, kind: str):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s\n")
    root = tmp_path / "root"
    if kind == "git":
        make_repo(root, {"a.txt": "a\n"})
    else:
        root.mkdir()
        (root / "a.txt").write_text("a\n")
    os.symlink(outside, root / "to_dir")
    os.symlink(outside / "secret.txt", root / "to_file")
    os.symlink("nowhere", root / "dangling")
    snap = tree.snapshot(root)
    assert sorted(snap) == ["a.txt", "dangling", "to_dir", "to_file"]
    assert {snap[n].kind for n in ("dangling", "to_dir", "to_file")} == {"link"}
    assert snap["to_dir"].target == str(outside) and snap["dangling"].target == "nowhere"
    assert snap["to_file"].size == len(str(outside / "secret.txt"))
    (outside / "secret.txt").write_text("changed, and longer\n")
    (outside / "more.txt").write_text("m\n")
    assert tree.changes(snap, tree.snapshot(root)) == []


# --------------------------------------------------------------------------- errors


def test_entries_that_vanish_during_the_walk_are_left_out(tmp_path: Path, monkeypatch):
    root = tmp_path / "root"
    for name in ("keep.txt", "gone.txt", "gone-dir/x.txt", "late-dir/y.txt"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x\n")
    real_scandir = os.scandir

    def racing_scandir(path):
        if isinstance(path, int):  # shutil.rmtree's own listing
            return real_scandir(path)
        if os.fspath(path) == str(root):
            entries = list(real_scandir(path))  # listed: now two of them go
            (root / "gone.txt").unlink()
            shutil.rmtree(root / "gone-dir")
            return contextlib.nullcontext(entries)
        if os.fspath(path).endswith("late-dir"):
            shutil.rmtree(path)  # stat'ed by its parent, gone before it is listed
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", racing_scandir)
    assert sorted(tree.snapshot(root)) == ["keep.txt"]


def test_files_git_lists_that_are_gone_are_left_out(tmp_path: Path, monkeypatch):
    repo = make_repo(tmp_path / "repo", {"deleted.txt": "d\n", "racing.txt": "r\n", "keep.txt": "k\n"})
    (repo / "deleted.txt").unlink()  # tracked, deleted in the work tree
    real_lstat = os.lstat

    def racing_lstat(path, *args, **kwargs):
        if os.fspath(path).endswith("racing.txt"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # listed by git, gone before it is stat'ed
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", racing_lstat)
    assert sorted(tree.snapshot(repo)) == ["keep.txt"]


def test_a_directory_that_cannot_be_listed_is_recorded_as_such(tmp_path: Path, monkeypatch):
    root = tmp_path / "root"
    (root / "locked").mkdir(parents=True)
    (root / "locked" / "inside.txt").write_text("x\n")
    (root / "open.txt").write_text("o\n")
    before = tree.snapshot(root)
    real_scandir = os.scandir

    def refusing_scandir(path):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refusing_scandir)
    after = tree.snapshot(root)
    assert after["locked"].kind == "dir" and after["locked"].error == "cannot list: Permission denied"
    assert "locked/inside.txt" not in after and "open.txt" in after
    assert tree.changes(before, after) == ["changed: locked (cannot list: Permission denied)",
                                           "removed: locked/inside.txt"]

    def refusing_everything(path):
        raise PermissionError(13, "Permission denied", os.fspath(path))

    monkeypatch.setattr(os, "scandir", refusing_everything)
    assert tree.snapshot(root) == {".": tree.Entry("dir", 0, 0, 0, 0, 0, error="cannot list: Permission denied")}


# --------------------------------------------------------------------------- byte identity


def test_content_digest_reads_in_blocks(tmp_path: Path):
    data = os.urandom(3 * tree.BLOCK_SIZE + 5)
    (tmp_path / "f").write_bytes(data)
    assert tree.content_digest(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert tree.content_digest(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_content_differences_proves_a_copy_byte_identical(tmp_path: Path):
    fixture = tmp_path / "fixture"
    for name, text in {".canarchy/config.toml": "a = 1\n", ".canrc": "rc\n", "can.conf": "[default]\n"}.items():
        (fixture / name).parent.mkdir(parents=True, exist_ok=True)
        (fixture / name).write_text(text)
    os.symlink("config.toml", fixture / ".canarchy" / "current")
    copy = tmp_path / "copy"
    shutil.copytree(fixture, copy, symlinks=True)
    assert tree.content_differences(fixture, copy) == []
    assert tree.changes(tree.snapshot(fixture, walk=tree.WHOLE), tree.snapshot(copy, walk=tree.WHOLE)) != []

    (copy / ".canarchy" / "config.toml").write_text("a = 2\n")  # same size
    (copy / ".canrc").write_text("rc, longer\n")
    (copy / ".canarchy" / "current").unlink()
    os.symlink("elsewhere", copy / ".canarchy" / "current")
    (copy / "can.conf").unlink()
    (copy / "extra").write_text("e\n")
    assert tree.content_differences(fixture, copy) == [
        "changed: .canarchy/config.toml (content)",
        "changed: .canarchy/current (link target config.toml -> elsewhere)",
        "changed: .canrc (size 3 -> 11)",
        "removed: can.conf",
        "added: extra",
    ]
    assert tree.content_differences(fixture, copy, only=[".canarchy/config.toml"]) == [
        "changed: .canarchy/config.toml (content)"]


# --------------------------------------------------------------------------- the benchmark's code


def test_the_benchmark_builds_the_trees_it_names(tmp_path: Path):
    made = {s: sentinel.build_scenario(tmp_path, s, files=30, sparse_bytes=1 << 30) for s in sentinel.SCENARIOS}
    for checkout, _home in made.values():
        assert len(list((checkout / "tests").glob("test_*.py"))) == 1
        assert (checkout / "tests" / "test_sample.py").read_text().count("def test_") == sentinel.TESTS
    checkout, _ = made["ignored"]
    assert len(list((checkout / sentinel.IGNORED_DIR).rglob("*.txt"))) == 30
    assert not any(n.startswith(sentinel.IGNORED_DIR) for n in tree.snapshot(checkout))
    checkout, _ = made["tracked"]
    assert len(git(checkout, "ls-files", "data").splitlines()) == 30
    _, home = made["home"]
    big = home / ".canarchy" / "big.bin"
    assert big.stat().st_size == 1 << 30
    with pytest.raises(ValueError, match="unknown scenario"):
        sentinel.build_scenario(tmp_path, "nonesuch")


def _result(snapshot_cpu: dict[str, float], plugin_cpu: dict[str, float], peak_kib: dict[str, int]):
    scenarios = {}
    for name in snapshot_cpu:
        runs = sentinel.ScenarioRuns()
        runs.snapshot.append({"seconds": snapshot_cpu[name], "cpu_seconds": snapshot_cpu[name],
                              "rss_before_kib": 10_000, "peak_kib": 10_000 + peak_kib[name], "entries": 5,
                              "changes": 0})
        for variant, cpu, peak in (("bare", 0.5, 30_000), ("plugin", 0.5 + plugin_cpu[name], 30_000 + peak_kib[name])):
            runs.pytest_wall[variant].append(cpu)
            runs.pytest_cpu[variant].append(cpu)
            runs.pytest_peak_kib[variant].append(peak)
        scenarios[name] = runs
    return sentinel.SentinelResult(files=100_000, sparse_bytes=2 << 30, rounds=1, scenarios=scenarios)


def test_the_benchmark_judges_each_tree_over_the_empty_checkout():
    result = _result({"empty": 0.010, "ignored": 0.025, "tracked": 1.2, "home": 0.011},
                     {"empty": 0.100, "ignored": 0.140, "tracked": 0.9, "home": 0.105},
                     {"empty": 100, "ignored": 100, "tracked": 9000, "home": 8 * 1024})
    judged = {name: {(form, what): met for form, what, _v, _l, met in rows}
              for name, rows in sentinel.verdicts(result).items()}
    assert judged["ignored"] == {("snapshot", "seconds"): True, ("pytest", "seconds"): False}
    assert judged["tracked"] == {("snapshot", "seconds"): False, ("pytest", "seconds"): True}
    assert judged["home"] == {("snapshot", "seconds"): True, ("snapshot", "peak_mib"): False,
                              ("pytest", "seconds"): True, ("pytest", "peak_mib"): False}
    text = "\n".join(sentinel.report_lines(result))
    assert "### 7. Sentinel" in text and "**missed**" in text and "met" in text


def test_the_benchmark_measures_a_real_run_with_and_without_the_plugin(tmp_path: Path):
    result = sentinel.run_sentinel(files=20, sparse_bytes=1 << 20, rounds=1, scenarios=("empty", "home"),
                                   warmup=False, log=lambda line: None)
    for name, runs in result.scenarios.items():
        assert runs.failures == [], name
        assert runs.snapshot[0]["changes"] == 0
        for variant in sentinel.VARIANTS:
            assert runs.pytest_wall[variant][0] > 0 and runs.pytest_peak_kib[variant][0] > 0
    # a clean checkout: nothing differs from git's index, so the sentinel records of it only what a
    # later run loads unasked (its pytest.ini and conftest.py) or imports (the tests directory at its top),
    # its .gitignore (what git leaves out), clean or not, and git's own
    own = len(checkout_state(make_repo(tmp_path / "r", {"a": "a\n"})))
    assert result.figures()["empty"]["entries"] == 4 + own and result.figures()["home"]["entries"] == 6 + own
    assert sentinel.main(["bad"]) == 2


def test_the_plugin_s_sentinel_names_the_test_that_changed_a_tracked_file(tmp_path: Path):
    """In a git checkout the sentinel compares what differs from git's index: a tracked file a
    test rewrote, and one it deleted, fail the run, the rewrite named with its writer."""
    from tests.isolation_child import run_child

    test_file = """
        from pathlib import Path
        def test_edits_the_checkout(request):
            root = Path(request.config.rootpath)
            (root / "notes.txt").write_text("rewritten by a test\\n")
            (root / "data.txt").unlink()
        def test_quiet():
            pass
    """
    make_repo(tmp_path / "project", {"notes.txt": "the operator's notes\n", "data.txt": "tracked data\n"})
    settle()
    run = run_child(tmp_path, {"test_edit.py": test_file})
    assert run.returncode == 1 and run.outcomes("test_quiet") == {"passed"}, run.output
    assert "the test run changed the checkout" in run.output, run.output
    assert (f"changed: notes.txt ({tree.INDEX_DIFFERS}) (written by test_edit.py::test_edits_the_checkout)"
            in run.output), run.output
    assert "removed: data.txt" in run.output and "test_edit.py (" not in run.output, run.output


def test_git_s_own_state_is_part_of_the_checkout_s(tmp_path: Path):
    """What a shell child does to git itself: staging a change (``git add``: the work tree then matches the
    index, and the change would vanish from the view above), committing it, or planting what the next git
    runs (``core.fsmonitor`` in ``.git/config``, a hook)."""
    repo = make_repo(tmp_path / "repo", {"notes.txt": "notes\n"})
    before = checkout_state(repo)
    (repo / "notes.txt").write_text("changed by a test\n")
    (repo / "new.py").write_text("planted = True\n")
    git(repo, "add", "-A")
    staged = checkout_state(repo)
    assert tree.changes(before, staged) == ["added: .git:staged/new.py", "added: .git:staged/notes.txt",
                                            "added: new.py"]
    git(repo, "commit", "-q", "-m", "hidden")
    assert tree.changes(before, checkout_state(repo))[0].startswith("changed: .git:HEAD (link target ")
    settle()
    with open(repo / ".git" / "config", "a") as config:
        config.write('[core]\n\tfsmonitor = "touch planted"\n')
    (repo / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\ntouch planted\n")
    found = tree.changes(staged, checkout_state(repo))
    assert "added: .git/hooks/pre-commit" in found and any(line.startswith("changed: .git/config") for line in found)


def test_the_next_look_lists_git_s_index_again_only_when_the_index_file_changed(tmp_path: Path):
    """The sentinel's next look reuses its listing of the index while the index file is the same (a checkout
    of many tracked files pays for one listing a run); a change to the index, a flag or a staged file, gives
    a new one, which sees it."""
    repo = make_repo(tmp_path / "repo", {"notes.txt": "notes\n", "tests/test_a.py": "def test(): pass\n"})
    first = checkout_state(repo)
    (repo / "notes.txt").write_text("a change in the work tree, not in the index\n")
    second = checkout_state(repo, previous=first)
    assert second.tracked is first.tracked and second.tracked.sources == ("tests/test_a.py",)
    assert tree.changes(first, second) == [f"changed: notes.txt ({tree.INDEX_DIFFERS})"]
    git(repo, "update-index", "--assume-unchanged", "notes.txt")
    third = checkout_state(repo, previous=second)
    assert third.tracked is not second.tracked and third.tracked.flagged == (("h", "notes.txt"),)
    assert tree.changes(second, third) == ["added: .git:flag/notes.txt",
                                           "changed: notes.txt (matches git's index again)"]


def test_what_tells_git_not_to_look_is_part_of_the_checkout_s_state(tmp_path: Path):
    """A shell child that tells git to skip a file (``--skip-worktree``, ``--assume-unchanged``) and then
    changes it, makes another commit stand for HEAD (``git replace``), or points git at another common
    directory (``.git/commondir``, with a config of its own): each shows."""
    repo = make_repo(tmp_path / "repo", {"notes.txt": "notes\n", "data.txt": "data\n"})
    before = checkout_state(repo)
    git(repo, "update-index", "--skip-worktree", "notes.txt")
    git(repo, "update-index", "--assume-unchanged", "data.txt")
    (repo / "notes.txt").write_text("changed where git does not look\n")
    found = tree.changes(before, checkout_state(repo, previous=before))  # as the sentinel's next look
    assert "added: .git:flag/notes.txt" in found and "added: .git:flag/data.txt" in found, found
    git(repo, "update-index", "--no-skip-worktree", "notes.txt")
    git(repo, "update-index", "--no-assume-unchanged", "data.txt")
    git(repo, "add", "notes.txt")
    tree_id = git(repo, "write-tree").strip()
    fake = git(repo, "commit-tree", tree_id, "-p", "HEAD", "-m", "stands for HEAD").strip()
    git(repo, "replace", git(repo, "rev-parse", "HEAD").strip(), fake)
    found = tree.changes(before, checkout_state(repo))
    assert "added: .git:staged/notes.txt" in found and "added: .git/refs/replace" in found, found
    git(repo, "pack-refs", "--all")  # the replace ref moves into packed-refs
    assert "added: .git/packed-refs" in tree.changes(before, checkout_state(repo))
    elsewhere = tmp_path / "elsewhere"  # a common directory of its own: refs, the objects, a config to plant in
    shutil.copytree(repo / ".git" / "refs", elsewhere / "refs")
    (elsewhere / "objects").symlink_to(repo / ".git" / "objects")
    shutil.copy(repo / ".git" / "config", elsewhere / "config")
    (repo / ".git" / "commondir").write_text(str(elsewhere) + "\n")
    assert "added: .git/commondir" in tree.changes(before, checkout_state(repo))


def test_what_a_shell_hides_from_git_where_an_import_finds_it_is_part_of_the_checkout_s_state(tmp_path: Path):
    """A shell child plants a module at a top of ``sys.path`` that is no package (``tests/``, rootdir-inserted)
    behind a ``.gitignore`` that hides itself too, a namespace package and a package behind their own, and git's
    rules in a directory deeper down: git shows nothing, the state shows each (what is already ignored at the
    start, a directory's content included, is not looked into)."""
    repo = make_repo(tmp_path / "repo", {"tests/conftest.py": "", "tests/test_a.py": "", "docs/guide/a.md": "",
                                         "pkg/__init__.py": ""}, gitignore="/data/\n")
    (repo / "data" / "sub").mkdir(parents=True)
    (repo / "data" / "sub" / "f.txt").write_text("x\n")
    before = checkout_state(repo, search_dirs=["tests"])
    subprocess.run(["sh", "-c", "cd tests && printf '*\\n' > .gitignore && echo 'import os' > msgpack.py "
                                "&& mkdir ns planted && echo x > ns/m.py && printf '*\\n' > ns/.gitignore "
                                "&& touch planted/__init__.py && printf '*\\n' > planted/.gitignore "
                                "&& cd ../docs/guide && printf '.git*\\n' > .gitignore "
                                "&& echo '*.md -diff' > .gitattributes "
                                "&& echo x > ../../data/sub/g.py"], cwd=repo, check=True)
    assert git(repo, "status", "--porcelain") == ""  # git shows nothing
    assert tree.changes(before, checkout_state(repo, search_dirs=["tests"])) == [
        "added: docs/guide/.gitattributes", "added: docs/guide/.gitignore", "added: tests/.gitignore",
        "added: tests/msgpack.py", "added: tests/ns", "added: tests/planted", "added: tests/planted/.gitignore",
        "added: tests/planted/__init__.py"]
    with open(repo / ".git" / "info" / "exclude", "a") as exclude:  # git's own rules: in its state already
        exclude.write("tests/hidden.py\n")
    (repo / "tests" / "hidden.py").write_text("X = 1\n")
    found = tree.changes(before, checkout_state(repo, search_dirs=["tests"]))
    assert "added: tests/hidden.py" in found and any(line.startswith("changed: .git/info/exclude") for line in found)


def test_a_package_s_entries_are_part_of_the_checkout_s_state(tmp_path: Path):
    """A subpackage that shadows a module (``pkg/helper/__init__.py`` runs ahead of ``pkg/helper.py``),
    hidden from git by a ``.gitignore`` of its own: the entries of a package are recorded, ignored or not."""
    repo = make_repo(tmp_path / "repo", {"pkg/__init__.py": "", "pkg/helper.py": "X = 1\n"})
    before = checkout_state(repo)
    (repo / "pkg" / "helper").mkdir()
    (repo / "pkg" / "helper" / ".gitignore").write_text("*\n")
    (repo / "pkg" / "helper" / "__init__.py").write_text("X = 'shadowed'\n")
    assert git(repo, "status", "--porcelain") == ""  # git shows nothing
    assert tree.changes(before, checkout_state(repo)) == [
        "added: pkg/helper", "added: pkg/helper/.gitignore", "added: pkg/helper/__init__.py"]
    (repo / ".gitignore").write_text("build/\n")  # what git and the skip-list walk leave out, as a package
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore build/")
    before = checkout_state(repo)
    (repo / "build").mkdir()
    (repo / "build" / "__init__.py").write_text("")
    (repo / "build" / "__main__.py").write_text("print('planted')\n")  # python -m build runs it
    assert tree.changes(before, checkout_state(repo)) == [
        "added: build", "added: build/__init__.py", "added: build/__main__.py"]
