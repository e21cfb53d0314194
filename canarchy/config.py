"""canarchy's configuration: one loader per source, precedence in one place.

Command-line flag > non-empty ``CANARCHY_*`` variable > ``~/.canarchy/config.toml`` (the path resolved at call
time, never at import) > built-in default; the keys, variables, defaults and checks are :data:`SETTINGS` (the
table is in ``docs/design/cli.md``). A key or table of the file that canarchy does not know is a finding
(:func:`check_document`): a warning on each command that reads the file (``canarchy.errors.COMMAND_WARNINGS``),
a failure of ``config check``. Errors: ``ConfigError`` ``CONFIG_INVALID`` (exit 1).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from canarchy.errors import COMMAND_WARNINGS, ConfigError

BACKENDS = ("python-can", "scaffold")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def config_path() -> Path:
    """Path of the user's configuration file, ``~/.canarchy/config.toml`` (resolved now)."""
    return Path.home() / ".canarchy" / "config.toml"


def _convert_backend(raw: Any) -> str:
    value = str(raw).strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"expected one of {', '.join(BACKENDS)}")
    return value


def _convert_lower(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("expected a non-empty string")
    return raw.strip().lower()


def _convert_channel(raw: Any) -> str | None:
    if not isinstance(raw, str):
        raise ValueError("expected a string")
    return raw.strip() or None


def _convert_limit(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected an integer >= 1")
    value = int(str(raw).strip()) if isinstance(raw, str) else raw
    if not isinstance(value, int) or value < 1:
        raise ValueError("expected an integer >= 1")
    return value


def _convert_timeout(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a number >= 0")
    value = float(str(raw).strip()) if isinstance(raw, str) else float(raw)
    if not value >= 0:
        raise ValueError("expected a number >= 0")
    return value


def _integer(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError("expected a whole number")
    try:
        return int(raw.strip().replace("_", ""), 10) if isinstance(raw, str) else raw
    except ValueError:
        raise ValueError("expected a whole number") from None


#: Nominal (arbitration) bit rate, bit/s: ISO 11898-1 classic CAN and the CAN FD arbitration phase go to 1 Mbit/s.
BITRATE_RANGE = (1_000, 1_000_000)
#: CAN FD data-phase bit rate, bit/s (adapters in use go to 8-12 Mbit/s).
DATA_BITRATE_RANGE = (1_000, 16_000_000)


def _bit_rate(low: int, high: int, example: int) -> Callable[[Any], int]:
    def convert(raw: Any) -> int:
        value = _integer(raw)
        if not low <= value <= high:
            raise ValueError(f"expected bit/s in {low}..{high}, e.g. {example}")
        return value

    return convert


_convert_bitrate = _bit_rate(*BITRATE_RANGE, 500_000)
_convert_data_bitrate = _bit_rate(*DATA_BITRATE_RANGE, 2_000_000)


def _convert_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("expected true or false")


def _convert_optional_bool(raw: Any) -> bool | None:
    return _convert_bool(raw)


def _convert_path(raw: Any) -> str | None:
    if not isinstance(raw, str):
        raise ValueError("expected a path string")
    return raw.strip() or None


#: Bus keyword arguments canarchy sets itself (or that would bypass its checks).
RESERVED_BUS_KWARGS = frozenset({"channel", "interface", "bustype", "ignore_config", "config_context", "context",
                                 "can_filters"})
#: Bus keyword arguments that have a setting of their own.
OWN_SETTING_BUS_KWARGS = {"bitrate": "transport.bitrate", "data_bitrate": "transport.data_bitrate",
                          "fd": "transport.fd"}


def bus_kwarg_value(text: str) -> Any:
    """A bus keyword argument's value written as text (variable, ``--bus-option``):
    ``true``/``false``, a decimal or ``0x`` integer, a number, else the text itself
    (surrounding quotes removed)."""
    raw = text.strip()
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(raw, 16) if lowered.startswith("0x") else int(raw, 10)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        pass
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    return raw


def parse_bus_kwargs_text(text: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs separated by commas or spaces, or a JSON object, as a dict.

    Raises ``ValueError`` when an item has no ``=`` or the JSON is not an object.
    """
    raw = text.strip()
    if raw.startswith("{"):
        import json

        try:
            document = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"not a JSON object: {exc}") from None
        if not isinstance(document, dict):
            raise ValueError("expected a JSON object")
        return document
    result: dict[str, Any] = {}
    position = 0
    while position < len(raw):
        match = re.compile(_KWARG_ITEM).match(raw, position)  # re caches the compiled pattern
        if match is None:
            raise ValueError(f"expected KEY=VALUE, got {raw[position:].split(',')[0].split()[0]!r}")
        result[match.group(1)] = bus_kwarg_value(match.group(2))
        position = match.end()
    return result


# KEY=VALUE, the value quoted or up to the next comma or space; then separators.
_KWARG_ITEM = r"""\s*([^=,\s]+)=("[^"]*"|'[^']*'|[^,\s]*)(?:\s*,\s*|\s+|\Z)"""


def _check_bus_kwarg(key: Any, value: Any) -> None:
    if not isinstance(key, str) or not (key.isascii() and key.isidentifier()):
        raise ValueError(f"{key!r} is not a keyword argument name")
    if key in OWN_SETTING_BUS_KWARGS:
        raise ValueError(f"{key} has a setting of its own: use {OWN_SETTING_BUS_KWARGS[key]}")
    if key in RESERVED_BUS_KWARGS:
        raise ValueError(f"{key} is set by canarchy itself and cannot be given here")
    scalars = (str, int, float, bool)
    if not (isinstance(value, scalars) or (isinstance(value, list) and all(isinstance(v, scalars) for v in value))):
        raise ValueError(f"{key} = {value!r}: expected a string, number, true/false or a list of them")


def _convert_bus_kwargs(raw: Any) -> dict[str, Any]:
    document = parse_bus_kwargs_text(raw) if isinstance(raw, str) else raw
    if not isinstance(document, dict):
        raise ValueError("expected a table of python-can keyword arguments")
    for key, value in document.items():
        _check_bus_kwarg(key, value)
    return dict(document)


@dataclass(frozen=True)
class Setting:
    """One configuration value: its file table and key, variable, default and converter."""

    table: str
    key: str
    variable: str
    default: Any
    convert: Callable[[Any], Any]
    error_code: str = "CONFIG_INVALID"

    @property
    def file_key(self) -> str:
        return f"{self.table}.{self.key}"


SETTINGS: tuple[Setting, ...] = (
    Setting("transport", "backend", "CANARCHY_TRANSPORT_BACKEND", "python-can", _convert_backend,
            "TRANSPORT_BACKEND_INVALID"),
    Setting("transport", "interface", "CANARCHY_PYTHON_CAN_INTERFACE", "socketcan", _convert_lower),
    Setting("transport", "default_interface", "CANARCHY_DEFAULT_INTERFACE", None, _convert_channel),
    # The default --count and --idle-timeout of `capture`; unset, a capture runs until stopped.
    Setting("transport", "capture_limit", "CANARCHY_CAPTURE_LIMIT", None, _convert_limit),
    Setting("transport", "capture_timeout", "CANARCHY_CAPTURE_TIMEOUT", None, _convert_timeout),
    # Bus parameters passed to python-can's Bus (unset: not passed, the interface's own default).
    Setting("transport", "bitrate", "CANARCHY_BITRATE", None, _convert_bitrate),
    Setting("transport", "data_bitrate", "CANARCHY_DATA_BITRATE", None, _convert_data_bitrate),
    Setting("transport", "fd", "CANARCHY_BUS_FD", None, _convert_optional_bool),
    Setting("transport", "bus_kwargs", "CANARCHY_BUS_KWARGS", {}, _convert_bus_kwargs),
    Setting("safety", "require_active_ack", "CANARCHY_REQUIRE_ACTIVE_ACK", False, _convert_bool),
    Setting("j1939", "dbc", "CANARCHY_J1939_DBC", None, _convert_path),
)
SETTINGS_BY_VARIABLE = {s.variable: s for s in SETTINGS}

#: Every table and key the file may have that canarchy reads: the settings above,
#: the caches' ``default_provider`` and the ``[plugins.<name>]`` tables (whose
#: keys belong to each plugin and are not checked), ``[transport.bus_kwargs]``
#: (python-can's, checked by their converter).
KNOWN_KEYS: dict[str, frozenset[str]] = {
    **{table: frozenset(s.key for s in SETTINGS if s.table == table) for table in {s.table for s in SETTINGS}},
    "dbc_cache": frozenset({"default_provider"}),
    "skills_cache": frozenset({"default_provider"}),
}
FREE_TABLES = frozenset({"plugins"})


def read_config_file(path: Path | None = None) -> dict[str, Any]:
    """Parse the TOML config file; a missing file reads as ``{}``.

    Raises ``ConfigError`` (``CONFIG_INVALID``) naming the file when it does
    not parse or cannot be read (:func:`canarchy.fileio.read_small_text`).
    """
    import tomllib  # here, not at import: commands that never read the file skip its ~10 ms

    path = config_path() if path is None else path
    text = read_config_text(path)
    if text is None:
        return {}
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            "CONFIG_INVALID",
            f"{path} is not valid TOML: {exc}",
            f"Fix the syntax of {path} or move it aside.",
        ) from None
    _report(check_document(document, path))
    return document


def read_config_text(path: Path) -> str | None:
    """The config file's text (None: there is none); ``ConfigError`` ``CONFIG_INVALID`` when it cannot be read."""
    from canarchy.fileio import UnreadableFile, read_small_text

    try:
        return read_small_text(path)
    except UnreadableFile as exc:
        raise ConfigError("CONFIG_INVALID", f"{path} {exc.reason}.", exc.hint) from None


# --- unknown keys and tables -------------------------------------------------------------------

def _report(findings: list[str]) -> None:
    """Each finding not yet reported in the running command: once on stderr, and kept for its
    envelope (``canarchy.errors.COMMAND_WARNINGS``, set by the CLI; outside a command: nothing)."""
    collected = COMMAND_WARNINGS.get()
    if collected is None:
        return
    for finding in findings:
        if finding not in collected:
            collected.append(finding)
            from canarchy.output import terminal_safe

            sys.stderr.write(terminal_safe(f"canarchy: warning: {finding}") + "\n")
            sys.stderr.flush()


def _all_keys() -> list[str]:
    return sorted(f"{table}.{key}" for table, keys in KNOWN_KEYS.items() for key in keys)


def _nearest_key(table: str | None, key: str) -> str | None:
    """The known dotted key meant by ``key`` in ``table`` (None: the top level)."""
    import difflib

    elsewhere = sorted(f"{t}.{key}" for t, keys in KNOWN_KEYS.items() if key in keys and t != table)
    if elsewhere:
        return elsewhere[0]
    if table in KNOWN_KEYS:
        close = difflib.get_close_matches(key, sorted(KNOWN_KEYS[table]), n=1, cutoff=0.6)
        if close:
            return f"{table}.{close[0]}"
    dotted = key if table is None else f"{table}.{key}"
    close = difflib.get_close_matches(dotted, _all_keys(), n=1, cutoff=0.6)
    return close[0] if close else None


def _nearest_table(name: str) -> str | None:
    import difflib

    close = difflib.get_close_matches(name, sorted(set(KNOWN_KEYS) | FREE_TABLES), n=1, cutoff=0.6)
    return close[0] if close else None


def check_document(document: dict[str, Any], path: Path | None = None) -> list[str]:
    """The config file's unknown tables and keys, one sentence each, naming the file and
    the nearest known table or key (``[]`` when every name is known). Values are not
    checked here: converting them raises ``CONFIG_INVALID``."""
    where = config_path() if path is None else path
    findings = []
    for name, value in document.items():
        if name in FREE_TABLES:
            continue
        if name in KNOWN_KEYS:
            if not isinstance(value, dict):
                continue  # load_file_values raises CONFIG_INVALID for it
            for key, item in value.items():
                if key in KNOWN_KEYS[name]:
                    continue
                kind = "table" if isinstance(item, dict) else "key"
                near = _nearest_key(name, key)
                findings.append(f"{where}: unknown {kind} {name}.{key}"
                                + (f" (did you mean {near}?)" if near else
                                   f" (known keys of [{name}]: {', '.join(sorted(KNOWN_KEYS[name]))})"))
            continue
        if isinstance(value, dict):
            near = _nearest_table(name)
            findings.append(f"{where}: unknown table [{name}]" + (f" (did you mean [{near}]?)" if near else
                            f" (known tables: {', '.join(sorted(set(KNOWN_KEYS) | FREE_TABLES))})"))
        else:
            near = _nearest_key(None, name)
            findings.append(f"{where}: unknown key {name} at the top level"
                            + (f" (did you mean {near}? it belongs in the [{near.split('.')[0]}] table)"
                               if near else ""))
    return findings


def load_file_values(path: Path | None = None) -> dict[str, Any]:
    """Return the config file's known values keyed by variable name, unconverted.

    ``{"CANARCHY_DEFAULT_INTERFACE": "vcan7", ...}``; a missing file reads as ``{}``.
    Raises ``ConfigError`` when a known table is not a table.
    """
    path = config_path() if path is None else path
    document = read_config_file(path)
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        table = document.get(setting.table)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise ConfigError(
                "CONFIG_INVALID",
                f"{path}: [{setting.table}] must be a table, got {table!r}.",
                f"Write it as a `[{setting.table}]` section in {path}.",
            )
        if setting.key in table:
            values[setting.variable] = table[setting.key]
    return values


def resolve(variable: str, flag_value: Any = None, file_values: dict[str, Any] | None = None) -> tuple[Any, str]:
    """Resolve one setting by precedence: flag > non-empty variable > file > default.

    Returns ``(value, source)`` with source ``"flag"``, ``"env"``, ``"file"`` or
    ``"default"``. Raises ``ConfigError`` naming the source, key and value when
    a value does not convert: ``TRANSPORT_BACKEND_INVALID`` for the backend,
    ``CONFIG_INVALID`` for the others.
    """
    setting = SETTINGS_BY_VARIABLE[variable]
    if flag_value is not None:
        return _converted(setting, flag_value, "flag", "the command line"), "flag"
    env_value = os.environ.get(variable)
    if env_value is not None and env_value.strip():
        return _converted(setting, env_value, "env", f"the environment variable {variable}"), "env"
    if file_values is None:
        file_values = load_file_values()
    if variable in file_values:
        return _converted(setting, file_values[variable], "file", f"{config_path()} key {setting.file_key}"), "file"
    return setting.default, "default"


def _converted(setting: Setting, raw: Any, source: str, where: str) -> Any:
    try:
        return setting.convert(raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            setting.error_code,
            f"Invalid value {raw!r} for {setting.file_key} from {where}: {exc}.",
            f"Set {setting.file_key} (or {setting.variable}) to a valid value.",
        ) from None


def value_problems() -> list[str]:
    """What ``config check`` reports of the values: each setting whose value does not convert (as :func:`resolve`
    names it), then, when every one converts, what :func:`load_config` finds of their combination."""
    file_values = load_file_values()
    problems = []
    for setting in SETTINGS:
        try:
            if setting.variable == "CANARCHY_BUS_KWARGS":
                resolve_bus_kwargs(None, file_values)
            else:
                resolve(setting.variable, None, file_values)
        except ConfigError as exc:
            problems.append(exc.message)
    if not problems:
        try:
            load_config()
        except ConfigError as exc:
            problems.append(exc.message)
    return problems


def load_config(flags: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Resolve every setting: ``{variable: {"value", "source", "key"}}``; ``flags``
    maps variables to command-line values (None: not given).

    ``CANARCHY_BUS_KWARGS`` is the merged table (see :func:`resolve_bus_kwargs`), its
    source the highest one that gave a key. Raises ``ConfigError`` as :func:`resolve`
    does, and ``CONFIG_INVALID`` for a CAN FD data bit rate below the nominal one.
    """
    flags = flags or {}
    file_values = load_file_values()
    resolved = {}
    for setting in SETTINGS:
        if setting.variable == "CANARCHY_BUS_KWARGS":
            entries = resolve_bus_kwargs(flags.get(setting.variable), file_values)
            order = ("default", "file", "env", "flag")
            source = max((e["source"] for e in entries.values()), key=order.index, default="default")
            value: Any = {name: e["value"] for name, e in entries.items()}
        else:
            value, source = resolve(setting.variable, flags.get(setting.variable), file_values)
        resolved[setting.variable] = {"value": value, "source": source, "key": setting.file_key}
    bitrate, data_bitrate = resolved["CANARCHY_BITRATE"], resolved["CANARCHY_DATA_BITRATE"]
    if bitrate["value"] is not None and data_bitrate["value"] is not None and data_bitrate["value"] < bitrate["value"]:
        raise ConfigError(
            "CONFIG_INVALID",
            f"transport.data_bitrate {data_bitrate['value']} (from {data_bitrate['source']}) is below "
            f"transport.bitrate {bitrate['value']} (from {bitrate['source']}).",
            "The CAN FD data phase runs at the nominal bit rate or faster: swap the values if they are reversed.",
        )
    if data_bitrate["value"] is not None and resolved["CANARCHY_BUS_FD"]["value"] is False:
        raise ConfigError(
            "CONFIG_INVALID",
            f"transport.data_bitrate is set (from {data_bitrate['source']}) but transport.fd is false "
            f"(from {resolved['CANARCHY_BUS_FD']['source']}).",
            "A data bit rate is for CAN FD: set transport.fd = true, or remove transport.data_bitrate.",
        )
    return resolved


def resolve_bus_kwargs(flag_value: dict[str, Any] | None = None,
                       file_values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The python-can bus keyword arguments, merged key by key: ``--bus-option`` over
    ``CANARCHY_BUS_KWARGS`` over ``[transport.bus_kwargs]``.

    Returns ``{name: {"value", "source"}}``. Raises ``ConfigError`` ``CONFIG_INVALID``
    naming the source for a name that is not an identifier, is set by canarchy
    (``channel``, ``interface``, ``can_filters`` ...), has a setting of its own
    (``bitrate``, ``data_bitrate``, ``fd``), or a value that is not a string,
    number, boolean or list of them.
    """
    setting = SETTINGS_BY_VARIABLE["CANARCHY_BUS_KWARGS"]
    if file_values is None:
        file_values = load_file_values()
    merged: dict[str, dict[str, Any]] = {}
    if "CANARCHY_BUS_KWARGS" in file_values:
        where = f"{config_path()} table [transport.bus_kwargs]"
        for name, value in _converted(setting, file_values["CANARCHY_BUS_KWARGS"], "file", where).items():
            merged[name] = {"value": value, "source": "file"}
    env_value = os.environ.get("CANARCHY_BUS_KWARGS")
    if env_value is not None and env_value.strip():
        converted = _converted(setting, env_value, "env", "the environment variable CANARCHY_BUS_KWARGS")
        for name, value in converted.items():
            merged[name] = {"value": value, "source": "env"}
    if flag_value:
        for name, value in _converted(setting, flag_value, "flag", "the command line (--bus-option)").items():
            merged[name] = {"value": value, "source": "flag"}
    return dict(sorted(merged.items()))
