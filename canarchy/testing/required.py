"""Import this module from a test module that must never run without canarchy's isolation::

    import canarchy.testing.required  # noqa: F401

The import fails (``ImportError``, so pytest reports the module as a
collection error and runs none of its tests) unless
``canarchy.testing.isolation.plugin`` is configured in this process. That holds however
the plugin was lost: ``-p no:canarchy.testing.isolation.plugin``, ``--noconftest``
together with ``-o addopts=`` or ``-c FILE``, or a test file run from another
project. A module that failed to import is not cached, so every test module
that imports this one is refused in turn.
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
