"""The suite runs under canarchy's hermetic plugin: see docs/design/test-isolation.md.

Import no canarchy module at the top of this file: it runs before the plugin
moves the process into its disposable home.
"""

import pytest

pytest_plugins = ["canarchy.testing.plugin"]


@pytest.fixture
def rigged_transport(monkeypatch):
    """Make building any transport fail loudly and record each attempt: for tests
    of paths that must never build one (the #530 reference path, dry runs)."""
    from canarchy import transport
    from canarchy.errors import TransportError

    attempts = []

    def rigged(*args, **kwargs):
        attempts.append((args, kwargs))
        raise TransportError("RIGGED_TRANSPORT", "a transport was built", "this path must not build one")

    monkeypatch.setattr(transport, "build_backend", rigged)
    monkeypatch.setattr(transport.PythonCanBackend, "_open_bus", rigged)
    return attempts
