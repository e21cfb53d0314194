"""The suite runs under canarchy's hermetic plugin: see docs/design/test-isolation.md.

Import no canarchy module at the top of this file: it runs before the plugin
moves the process into its disposable home.
"""

import pytest

pytest_plugins = ["canarchy.testing.isolation.plugin"]
_PLUGIN = "canarchy.testing.isolation.plugin"


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to run canarchy's suite with its isolation switched off
    (``-p no:canarchy.testing.isolation.plugin``): many tests write under the home and
    the working directory, which only the plugin makes disposable."""
    if not config.pluginmanager.has_plugin(_PLUGIN):
        raise pytest.UsageError(
            f"canarchy's tests run only under its isolation plugin ({_PLUGIN}), which this run disabled: "
            "without it they would write into your ~/.canarchy and this checkout. "
            f"Remove `-p no:{_PLUGIN}` (from the command line or PYTEST_ADDOPTS)."
        )
    from canarchy.testing.isolation.plugin import require_containment

    require_containment(config)  # also when -c named another config file (pyproject's ini is lost then)


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


@pytest.fixture
def peer(monkeypatch, virtual_channel):
    """A bus on the test's virtual channel; canarchy uses the virtual bus type and needs no typed YES."""
    import can

    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")
    monkeypatch.setenv("CANARCHY_MCP_NONINTERACTIVE_ACK", "1")
    with can.Bus(channel=virtual_channel, interface="virtual", ignore_config=True) as bus:
        yield bus
