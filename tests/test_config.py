"""Configuration: precedence (flag > env > file > default), conversion, errors, ``config show``.

These tests set their configuration through their own fixtures (a file in the
test's disposable home, ``monkeypatch.setenv``): REQ-TISO-08.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import pytest
from pathlib import Path

from canarchy import config, frames, transport
from canarchy.errors import ConfigError
from tests.helpers import run_cli, write_user_config


def test_defaults_without_file_or_env():
    settings = transport.transport_backend_config()
    assert settings == transport.TransportConfig("python-can", "socketcan", None, None)
    assert settings.bus_options == {}  # nothing passed to python-can that the user did not set
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
    assert len(settings) == 11
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


def _config_run(*argv: str, seconds: float = 20):
    """``run_cli(*argv)`` in a thread; None when it is still running after ``seconds`` (blocked on a read)."""
    import threading

    done: list = []
    worker = threading.Thread(target=lambda: done.append(run_cli(*argv)), daemon=True)
    worker.start()
    worker.join(seconds)
    return done[0] if done else None


@pytest.mark.parametrize("make, words", [
    ("fifo", "is not a regular file"), ("dangling", "which does not exist"), ("large", "is larger than 1048576 bytes"),
    ("directory", "is a directory"), ("loop", "is a loop of symbolic links"),
    ("home file", "a directory on its path is a file")])
def test_a_config_file_that_cannot_be_read_as_one_is_config_invalid_at_once(make, words):
    """A named pipe is never waited on, a dangling link is no missing file (its settings would silently fall back
    to the defaults), a file of gigabytes is not read into memory: each is CONFIG_INVALID naming why, and how."""
    import os

    path = Path.home() / ".canarchy" / "config.toml"
    path.parent.mkdir(parents=True)
    if make == "fifo":
        os.mkfifo(path)
    elif make == "dangling":
        path.symlink_to(path.parent / "moved.toml")
    elif make == "large":
        with open(path, "wb") as handle:
            handle.truncate(2 << 30)  # sparse: 2 GiB that take no disk
    elif make == "directory":
        path.mkdir()
    elif make == "loop":
        path.symlink_to(path)
    else:
        path.parent.rmdir()
        path.parent.write_text("")
    result = _config_run("config", "check", "--json")
    if result is None and make == "fifo":  # a reader blocked in open(): a writer lets it go
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert result is not None, "config check still waits on the named pipe"
    assert (result.code, result.error_codes) == (1, ["CONFIG_INVALID"]), result.out
    error = result.envelope["errors"][0]
    assert words in error["message"] and "Check the permissions" not in error["hint"], error


def test_a_config_file_with_a_byte_order_mark_is_read():
    """Notepad and other editors start a UTF-8 file with a byte order mark, which TOML does not allow: it is
    dropped, as the candump reader drops it."""
    path = write_user_config("")
    path.write_bytes(b'\xef\xbb\xbf[transport]\ndefault_interface = "bom7"\n')
    result = run_cli("config", "show", "--json")
    assert result.code == 0, result.out
    assert result.data["settings"]["CANARCHY_DEFAULT_INTERFACE"] == {"key": "transport.default_interface",
                                                                     "value": "bom7", "source": "file"}


# -- bus parameters: bitrate, data_bitrate, fd, [transport.bus_kwargs] -----------------------------

def test_bus_parameters_from_file_env_and_flags(monkeypatch):
    write_user_config('[transport]\ninterface = "pcan"\nbitrate = 250000\n'
                      '[transport.bus_kwargs]\nf_clock_mhz = 80\nstate = "ACTIVE"\n')
    monkeypatch.setenv("CANARCHY_BUS_KWARGS", "state=PASSIVE, receive_own_messages=true")
    settings = transport.transport_backend_config({"CANARCHY_DATA_BITRATE": "2000000", "CANARCHY_BUS_FD": True,
                                                   "CANARCHY_BUS_KWARGS": {"f_clock_mhz": "40"}})
    assert settings.bus_options == {"bitrate": 250000, "data_bitrate": 2_000_000, "fd": True, "f_clock_mhz": "40",
                                    "state": "PASSIVE", "receive_own_messages": True}
    entries = config.resolve_bus_kwargs()
    assert entries == {"f_clock_mhz": {"value": 80, "source": "file"},
                       "receive_own_messages": {"value": True, "source": "env"},
                       "state": {"value": "PASSIVE", "source": "env"}}


@pytest.mark.parametrize("text,expected", [
    ("hop_limit=0", {"hop_limit": 0}),
    ('app_name="CAN alyzer" serial=0x10, poll_interval=0.5', {"app_name": "CAN alyzer", "serial": 16,
                                                             "poll_interval": 0.5}),
    ('{"serial": 12345, "app_name": "x"}', {"serial": 12345, "app_name": "x"}),
])
def test_bus_kwargs_text_forms(text, expected):
    assert config.parse_bus_kwargs_text(text) == expected


@pytest.mark.parametrize("document,words", [
    ('[transport]\nbitrate = 2000000\n', ["transport.bitrate", "2000000", "1000..1000000"]),
    ('[transport]\nbitrate = "fast"\n', ["transport.bitrate", "whole number"]),
    ('[transport]\nbitrate = true\n', ["transport.bitrate"]),
    ('[transport]\ndata_bitrate = 500\n', ["transport.data_bitrate"]),
    ('[transport]\nbitrate = 500000\ndata_bitrate = 250000\n', ["below", "transport.bitrate"]),
    ('[transport]\nfd = false\ndata_bitrate = 2000000\n', ["transport.fd"]),
    ('[transport]\nfd = "maybe"\n', ["transport.fd"]),
    ('[transport.bus_kwargs]\nbitrate = 500000\n', ["own", "transport.bitrate"]),
    ('[transport.bus_kwargs]\nchannel = "can1"\n', ["channel", "set by canarchy"]),
    ('[transport.bus_kwargs]\ntiming = { f_clock = 8000000 }\n', ["timing"]),
    ('[transport]\nbus_kwargs = 3\n', ["bus_kwargs"]),
])
def test_bad_bus_parameters_are_config_invalid(document, words):
    write_user_config(document)
    result = run_cli("config", "show", "--json")
    assert (result.code, result.error_codes) == (1, ["CONFIG_INVALID"]), result.out
    message = result.envelope["errors"][0]["message"]
    for word in words:
        assert word in message, (word, message)


def test_bus_parameters_reach_python_can(monkeypatch, virtual_channel):
    """What the settings say is what python-can's Bus is given (the virtual bus accepts keyword arguments)."""
    import can

    write_user_config('[transport]\ninterface = "virtual"\nbitrate = 500000\n'
                      '[transport.bus_kwargs]\npreserve_timestamps = true\n')
    seen = {}
    real_bus = can.Bus

    def recording_bus(*args, **kwargs):
        seen.update(kwargs)
        return real_bus(*args, **kwargs)

    monkeypatch.setattr(can, "Bus", recording_bus)
    backend = transport.build_backend()
    with backend.sender(virtual_channel) as send:
        send(frames.CanFrame(0x123, b"\x01"))
    assert seen == {"channel": virtual_channel, "interface": "virtual", "ignore_config": True, "bitrate": 500000,
                    "preserve_timestamps": True}


def test_config_show_lists_bus_kwargs_with_sources(monkeypatch):
    write_user_config('[transport.bus_kwargs]\nserial = 12345\n')
    monkeypatch.setenv("CANARCHY_BUS_KWARGS", "app_name=canarchy")
    result = run_cli("config", "show", "--json")
    assert result.code == 0, result.out
    assert result.data["bus_kwargs"] == {"app_name": {"value": "canarchy", "source": "env"},
                                         "serial": {"value": 12345, "source": "file"}}
    assert result.data["settings"]["CANARCHY_BUS_KWARGS"]["value"] == {"app_name": "canarchy", "serial": 12345}
    text = run_cli("config", "show", "--text").out
    assert "serial" in text and "(file)" in text and "app_name" in text


# -- unknown keys and tables ---------------------------------------------------------------------

MISSPELT = """bitrate = 500000
[transprot]
interface = "pcan"
[transport]
interfce = "pcan"
[safety]
bitrate = 250000
"""


def test_unknown_names_are_warnings_naming_the_nearest_known_one(capsys):
    path = write_user_config(MISSPELT)
    result = run_cli("config", "show", "--json")
    assert result.code == 0
    warnings = result.envelope["warnings"]
    assert warnings == [
        f"{path}: unknown key bitrate at the top level (did you mean transport.bitrate? it belongs in the "
        "[transport] table)",
        f"{path}: unknown table [transprot] (did you mean [transport]?)",
        f"{path}: unknown key transport.interfce (did you mean transport.interface?)",
        f"{path}: unknown key safety.bitrate (did you mean transport.bitrate?)",
    ]
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "unknown" in line] == [f"canarchy: warning: {w}" for w in warnings]


def test_every_command_that_reads_the_file_warns(capsys):
    write_user_config('[transport]\nbackend = "scaffold"\ncapture_limt = 3\n')
    for argv in (["capture", "scaffold0", "--count", "1", "--json"], ["send", "scaffold0", "0x123", "--json"],
                 ["dbc", "cache", "list", "--json"]):
        result = run_cli(*argv)
        assert result.code == 0, (argv, result.out)
        assert any("transport.capture_limt (did you mean transport.capture_limit?)" in w
                   for w in result.envelope["warnings"]), argv
        assert capsys.readouterr().err.count("capture_limt") == 1, argv  # once per command, however often read


def test_known_names_give_no_warning(capsys):
    write_user_config('[transport]\nbitrate = 500000\n[transport.bus_kwargs]\nanything_python_can_takes = 1\n'
                      '[dbc_cache]\ndefault_provider = "x"\n[plugins.mine]\nenabled = true\nown_key = 3\n')
    result = run_cli("config", "check", "--json")
    assert result.code == 0 and result.envelope["warnings"] == [], result.out
    assert "warning" not in capsys.readouterr().err


def test_config_check_fails_on_unknown_names_and_bad_values():
    path = write_user_config(MISSPELT)
    result = run_cli("config", "check", "--json")
    assert (result.code, result.error_codes) == (1, ["CONFIG_CHECK_FAILED"])
    message = result.envelope["errors"][0]["message"]
    assert message.startswith("4 problem(s)") and "[transprot]" in message and str(path) in message
    write_user_config('[transport]\nbitrate = 5\n')
    result = run_cli("config", "check", "--json")
    assert (result.code, result.error_codes) == (1, ["CONFIG_CHECK_FAILED"])
    assert "transport.bitrate" in result.envelope["errors"][0]["message"]


def test_config_check_reports_every_value_that_does_not_convert():
    """Three bad values: all three named (it reported the last setting it tried, one of them), in one run."""
    write_user_config('[transport]\nbitrate = "fast"\nfd = "maybe"\ncapture_limit = -5\n')
    result = run_cli("config", "check", "--json")
    assert (result.code, result.error_codes) == (1, ["CONFIG_CHECK_FAILED"])
    message = result.envelope["errors"][0]["message"]
    assert message.startswith("3 problem(s)"), message
    assert all(key in message for key in ("transport.bitrate", "transport.fd", "transport.capture_limit")), message


def test_config_check_without_a_file_passes():
    result = run_cli("config", "check", "--text")
    assert result.code == 0 and "not found" in result.out
