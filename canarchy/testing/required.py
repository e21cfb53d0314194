"""Import this module from a test module that must never run without canarchy's isolation::

    import canarchy.testing.required  # noqa: F401

The import raises ``ImportError`` (a collection error: none of the module's tests run) unless
``canarchy.testing.isolation.plugin`` is configured in this process, however the plugin was lost; a failed
import is not cached, so every module that imports this one is refused in turn. A child process of an
isolated test that imports the test's module (a ``multiprocessing`` worker started with ``spawn`` or
``forkserver``) runs under that test's guards and may import it. See ``docs/design/test-isolation.md``
("Loading").
"""

from __future__ import annotations

import os

from canarchy.testing.isolation import access, guard
from canarchy.testing.isolation.plugin import active_sandbox

_GUARDED_CHILD = (os.environ.get("PYTEST_CANARCHY_GUARD") == "1" and access.GUARD.enabled
                  and guard.GUARD.enabled)  # both guards turned on by the child hook, owned by the parent's test

if active_sandbox() is None and not _GUARDED_CHILD:
    raise ImportError(
        "canarchy's isolation (canarchy.testing.isolation.plugin) is not active in this pytest run, "
        "and this test module must not run without it: it would read and write your real ~/.canarchy "
        "and the checkout. Run "
        "`python -m pytest` from the checkout (its conftest.py and pyproject.toml load the plugin), and "
        "do not pass -p no:canarchy.testing.isolation.plugin, --noconftest with -o addopts= or -c."
    )
