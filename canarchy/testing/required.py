"""Import this module from a test module that must never run without canarchy's isolation::

    import canarchy.testing.required  # noqa: F401

The import raises ``ImportError`` (a collection error: none of the module's tests run) unless
``canarchy.testing.isolation.plugin`` is configured in this process, however the plugin was lost; a failed
import is not cached, so every module that imports this one is refused in turn. See
``docs/design/test-isolation.md`` ("Loading").
"""

from __future__ import annotations

from canarchy.testing.isolation.plugin import active_sandbox

if active_sandbox() is None:
    raise ImportError(
        "canarchy's isolation (canarchy.testing.isolation.plugin) is not active in this pytest run, "
        "and this test module must not run without it: it would read and write your real ~/.canarchy "
        "and the checkout. Run "
        "`python -m pytest` from the checkout (its conftest.py and pyproject.toml load the plugin), and "
        "do not pass -p no:canarchy.testing.isolation.plugin, --noconftest with -o addopts= or -c."
    )
