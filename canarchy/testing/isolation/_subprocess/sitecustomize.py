"""Installed into child Python processes started by a test (via PYTHONPATH).

When ``PYTEST_CANARCHY_GUARD=1`` (set by canarchy's pytest plugin for
isolated tests), the child gets the same CAN bus guard as its parent; a
refusal names the parent test (from ``PYTEST_CURRENT_TEST``) and is written to
``PYTEST_CANARCHY_GUARD_DIR`` so the parent test fails even if the child
swallowed the error. Any ``sitecustomize`` this one shadows is run afterwards.
"""

import os
import sys


def _activate() -> None:
    if os.environ.get("PYTEST_CANARCHY_GUARD") != "1":
        return
    try:
        from canarchy.testing.isolation import _child
    except ImportError:  # a Python without canarchy has no python-can of ours to guard
        return
    _child.activate()


def _chain() -> None:
    """Run the sitecustomize that this file shadows, if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_activate()
_chain()
