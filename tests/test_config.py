"""Configuration: precedence (flag > env > file > default), conversion, errors, ``config show``.

These tests set their configuration through their own fixtures (a file in the
test's disposable home, ``monkeypatch.setenv``): REQ-TISO-08.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import pytest
from pathlib import Path

from canarchy import config, transport
from canarchy.errors import ConfigError
from tests.helpers import run_cli, write_user_config


def test_defaults_without_file_or_env():
    settings = transport.transport_backend_config()
    assert settings == transport.TransportConfig("python-can", "socketcan", 2, 0.05)
    assert transport.default_can_interface() is None
    assert transport._load_user_config() == {}


def test_file_values_are_keyed_by_variable():
    write_user_config('[transport]\ninterface = " UDP_Multicast "\ndefault_interface = "vcan7"\n'
                      'capture_limit = 5\n[safety]\nrequire_active_ack = true\n[j1939]\ndbc = "x.dbc"\n')
    assert transport._load_user_config() == {
        "CANARCHY_PYTHON_CAN_INTERFACE": " UDP_Multicast ",
        "CANARCHY_DEFAULT_INTERFACE": "vcan7",
        "CANARCHY_CAPTURE_LIMIT": 5,
        "CANARCHY_REQUIRE_ACTIVE_ACK": True,
        "CANARCHY_J1939_DBC": "x.dbc",
    }
    settings = transport.transport_backend_config()
    assert (settings.bus_type, settings.capture_limit) == ("udp_multicast", 5)
    assert transport.default_can_interface() == "vcan7"


def test_env_beats_file_and_blank_env_does_not(monkeypatch):
    write_user_config('[transport]\ndefault_interface = "vcan7"\n')
    monkeypatch.setenv("CANARCHY_DEFAULT_INTERFACE", "vcan9")
    assert transport.default_can_interface() == "vcan9"
    monkeypatch.setenv("CANARCHY_DEFAULT_INTERFACE", "   ")
    assert transport.default_can_interface() == "vcan7"


def test_flag_beats_env(monkeypatch):
    monkeypatch.setenv("CANARCHY_CAPTURE_LIMIT", "7")
    assert config.resolve("CANARCHY_CAPTURE_LIMIT", flag_value=3) == (3, "flag")
    assert config.resolve("CANARCHY_CAPTURE_LIMIT") == (7, "env")


@pytest.mark.parametrize("raw,expected", [("1", True), ("true", True), ("YES", True), ("on", True),
                                          ("0", False), ("false", False), ("off", False)])
def test_require_active_ack_conversion(monkeypatch, raw, expected):
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", raw)
    assert config.resolve("CANARCHY_REQUIRE_ACTIVE_ACK")[0] is expected


@pytest.mark.parametrize("variable,raw,code", [
    ("CANARCHY_TRANSPORT_BACKEND", "carrier-pigeon", "TRANSPORT_BACKEND_INVALID"),
    ("CANARCHY_CAPTURE_LIMIT", "0", "CONFIG_INVALID"),
    ("CANARCHY_CAPTURE_LIMIT", "many", "CONFIG_INVALID"),
    ("CANARCHY_CAPTURE_TIMEOUT", "-1", "CONFIG_INVALID"),
    ("CANARCHY_REQUIRE_ACTIVE_ACK", "maybe", "CONFIG_INVALID"),
])
def test_bad_env_value_is_a_structured_error(monkeypatch, variable, raw, code):
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ConfigError) as caught:
        config.load_config()
    assert caught.value.code == code
    assert variable in caught.value.message and repr(raw) in caught.value.message
    assert caught.value.hint


def test_malformed_toml_names_the_file():
    path = write_user_config("[transport\ninterface = socketcan\n")
    result = run_cli("config", "show", "--json")
    assert result.code == 1
    assert result.error_codes == ["CONFIG_INVALID"]
    assert str(path) in result.envelope["errors"][0]["message"]
    assert "Traceback" not in result.out


def test_bad_file_value_names_file_key_and_value():
    path = write_user_config("[transport]\ncapture_limit = -3\n")
    result = run_cli("config", "show", "--json")
    assert (result.code, result.error_codes) == (1, ["CONFIG_INVALID"])
    message = result.envelope["errors"][0]["message"]
    assert str(path) in message and "transport.capture_limit" in message and "-3" in message


def test_table_that_is_not_a_table():
    write_user_config('transport = "socketcan"\n')
    result = run_cli("config", "show", "--json")
    assert (result.code, result.error_codes) == (1, ["CONFIG_INVALID"])


def test_config_show_reports_sources(monkeypatch):
    path = write_user_config('[transport]\ndefault_interface = "vcan7"\n')
    monkeypatch.setenv("CANARCHY_CAPTURE_LIMIT", "9")
    result = run_cli("config", "show", "--json")
    assert result.code == 0
    data = result.data
    assert data["config_path"] == str(path) and data["config_found"] is True
    settings = data["settings"]
    assert len(settings) == 7
    assert settings["CANARCHY_DEFAULT_INTERFACE"] == {"key": "transport.default_interface", "value": "vcan7",
                                                      "source": "file"}
    assert settings["CANARCHY_CAPTURE_LIMIT"]["source"] == "env" and settings["CANARCHY_CAPTURE_LIMIT"]["value"] == 9
    assert settings["CANARCHY_TRANSPORT_BACKEND"] == {"key": "transport.backend", "value": "python-can",
                                                      "source": "default"}


def test_config_show_text_without_file():
    result = run_cli("config", "show", "--text")
    assert result.code == 0
    assert "(not found)" in result.out.splitlines()[0]
    assert "transport.backend" in result.out


def test_config_that_is_not_utf8_is_a_structured_error():
    path = Path.home() / ".canarchy" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'[transport]\ninterface = "x"\n# caf\xe9\n')
    for argv in (["config", "show", "--json"], ["capture", "--json"]):
        result = run_cli(*argv)
        assert (result.code, result.error_codes) == (1, ["CONFIG_INVALID"]), argv
        assert "not UTF-8" in result.envelope["errors"][0]["message"]
