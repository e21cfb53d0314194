"""The bus guard and python-can scrub for a child process of an isolated test.

Imported by ``_subprocess/sitecustomize.py``; keeps the child's start-up
cheap (python-can is patched only if and when the child imports it).
"""

from __future__ import annotations

import os
from pathlib import Path

from canarchy.testing.isolation import CHILD_HOOK_DIR, PACKAGE_PARENT, guard, sandbox


#: Who a child process's refusal names when it runs no test of its parent's (``PYTEST_CURRENT_TEST`` unset).
UNKNOWN_OWNER = "<unknown test (child process)>"


def parent_nodeid(current_test: str | None) -> str:
    """The node id in ``PYTEST_CURRENT_TEST`` (``"path::name (call)"``) without the phase; outside any test, a
    pytest-xdist worker (``PYTEST_XDIST_WORKER``) is named, with what runs there first: its conftests."""
    if not current_test:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        return f"<pytest-xdist worker {worker}, outside any test (its conftests, as it starts)>" if worker else (
            UNKNOWN_OWNER)
    nodeid, _, _phase = current_test.rpartition(" ")
    return nodeid or current_test


def activate() -> None:
    """Enable the bus guard and the access guard in this process, owned by the parent's current test."""
    from canarchy.testing.isolation import audithook

    audithook.activate_from_environment()
    guard.GUARD.owner = parent_nodeid(os.environ.get("PYTEST_CURRENT_TEST"))
    report_dir = os.environ.get("PYTEST_CANARCHY_GUARD_DIR")
    guard.GUARD.report_dir = Path(report_dir) if report_dir else None
    guard.GUARD.enabled = True
    guard.install()
    guard.after_import("can.interface", sandbox.scrub_python_can)


def keep_the_hook(env: object) -> bool:
    """Put the child's start-up hook back on ``env``'s ``PYTHONPATH`` (in place, before the entries it holds) when
    ``env`` (a child's environment, as handed to ``subprocess``, ``os.exec*``, ``os.posix_spawn``) still carries
    the guard (``PYTEST_CANARCHY_GUARD``) but a test replaced or removed ``PYTHONPATH`` (``dict(os.environ,
    PYTHONPATH=...)``): a Python child would start without its guard. True when it did."""
    if not isinstance(env, dict) or env.get("PYTEST_CANARCHY_GUARD") != "1":
        return False
    entries = [entry for entry in str(env.get("PYTHONPATH", "")).split(os.pathsep) if entry]
    if CHILD_HOOK_DIR in entries:
        return False
    env["PYTHONPATH"] = os.pathsep.join([CHILD_HOOK_DIR, *([] if PACKAGE_PARENT in entries else [PACKAGE_PARENT]),
                                         *entries])
    return True
