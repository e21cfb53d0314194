"""How a pytest-xdist controller hands each worker the operator's environment, which the worker needs for the tests
that opt out of the isolation: ``workerinput`` is a dict every conftest's ``pytest_configure_node`` reads, so it
carries only the path of a file, in a directory beside the run's sandbox that the guard refuses to tests and hooks
(in the controller and in every worker), written and removed by the plugin's own calls (the standard library's,
pathlib's and shutil's, would be judged). Design: ``docs/design/test-isolation.md`` (pytest-xdist workers).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from canarchy.testing.isolation import access as _access
from canarchy.testing.isolation.sandbox import HANDED_SUFFIX, Sandbox
from canarchy.testing.isolation.settings import _is_worker

#: The ``workerinput`` key that names the file.
WORKERINPUT_KEY = "canarchy_operator_env_file"


def handed_directory(sandbox: Sandbox) -> Path:
    """Where the controller hands each pytest-xdist worker the operator's environment
    (:func:`write_for`), beside the run's sandbox (whose removal would otherwise meet a
    refused tree): refused to tests and hooks, in the controller and in every worker."""
    return sandbox.root.with_name(sandbox.root.name + HANDED_SUFFIX)


def operator_env_of(config: pytest.Config) -> tuple[dict[str, str], tuple[str, ...]]:
    """The operator's environment, and where it came from that the guard must refuse: this process's own; in a
    pytest-xdist worker, the controller's (:func:`_operator_env_of_the_controller`), from a directory."""
    if not _is_worker(config):
        return dict(os.environ), ()
    directory = os.path.dirname(config.workerinput[WORKERINPUT_KEY])
    return _operator_env_of_the_controller(config), (directory,)


def _operator_env_of_the_controller(config: pytest.Config) -> dict[str, str]:
    """A worker's start: the operator's environment, from the file the controller named in ``workerinput``, read
    and removed by the plugin's own calls (the guard a worker inherits refuses the directory to all else)."""
    path = config.workerinput.pop(WORKERINPUT_KEY)
    with _access.GUARD.exempt():
        fd = os.open(path, os.O_RDONLY)
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(fd)
            os.remove(path)
    return json.loads(b"".join(chunks))


def write_for(sandbox: Sandbox, worker: str) -> str:
    """A file that hands ``worker`` the operator's environment (JSON, mode 0600), which the worker reads and
    removes as it starts, in a directory of the run's sandbox the guard refuses to tests and hooks
    (:func:`handed_directory`; made after the containment, so that its view does not cover it)."""
    directory = handed_directory(sandbox)
    path = os.path.join(directory, f"{worker}.json")
    with _access.GUARD.exempt():  # the plugin's own calls: the standard library's (pathlib's) would be judged
        if not os.path.isdir(directory):
            os.mkdir(directory, 0o700)
        if os.path.lexists(path):
            os.remove(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, json.dumps(sandbox.operator_env).encode())  # small: one write
        finally:
            os.close(fd)
    return path


def remove(sandbox: Sandbox) -> None:
    """Remove what :func:`write_for` left (the files of workers that never started), by the
    plugin's own calls: the standard library's ``shutil.rmtree`` would be judged, and refused there."""
    directory = handed_directory(sandbox)
    with _access.GUARD.exempt(), contextlib.suppress(OSError):
        for name in os.listdir(directory):
            os.remove(os.path.join(directory, name))
        os.rmdir(directory)
