"""canarchy's configuration: one loader per source, precedence in one place.

Precedence, highest first: command-line flag > non-empty ``CANARCHY_*``
variable > ``~/.canarchy/config.toml`` > built-in default.

The file path is resolved when a function is called (``Path.home()`` at call
time), never at import. Keys (see ``docs/design/cli.md``):

======================================  ===============================  ==============
file key                                variable                         default
======================================  ===============================  ==============
``transport.backend``                   CANARCHY_TRANSPORT_BACKEND       ``python-can``
``transport.interface`` (bus type)      CANARCHY_PYTHON_CAN_INTERFACE    ``socketcan``
``transport.default_interface``         CANARCHY_DEFAULT_INTERFACE       none
``transport.capture_limit``             CANARCHY_CAPTURE_LIMIT           2
``transport.capture_timeout`` (s)       CANARCHY_CAPTURE_TIMEOUT         0.05
``safety.require_active_ack``           CANARCHY_REQUIRE_ACTIVE_ACK      false
``j1939.dbc``                           CANARCHY_J1939_DBC               none
======================================  ===============================  ==============
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from canarchy.errors import ConfigError

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


def _convert_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("expected true or false")


def _convert_path(raw: Any) -> str | None:
    if not isinstance(raw, str):
        raise ValueError("expected a path string")
    return raw.strip() or None


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
    Setting("transport", "capture_limit", "CANARCHY_CAPTURE_LIMIT", 2, _convert_limit),
    Setting("transport", "capture_timeout", "CANARCHY_CAPTURE_TIMEOUT", 0.05, _convert_timeout),
    Setting("safety", "require_active_ack", "CANARCHY_REQUIRE_ACTIVE_ACK", False, _convert_bool),
    Setting("j1939", "dbc", "CANARCHY_J1939_DBC", None, _convert_path),
)
SETTINGS_BY_VARIABLE = {s.variable: s for s in SETTINGS}


def read_config_file(path: Path | None = None) -> dict[str, Any]:
    """Parse the TOML config file; a missing file reads as ``{}``.

    Raises ``ConfigError`` (``CONFIG_INVALID``) naming the file when it does
    not parse, is not UTF-8, or cannot be read.
    """
    import tomllib  # here, not at import: commands that never read the file skip its ~10 ms

    path = config_path() if path is None else path
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            "CONFIG_INVALID",
            f"{path} is not valid TOML: {exc}",
            f"Fix the syntax of {path} or move it aside.",
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "CONFIG_INVALID",
            f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02X} at offset {exc.start}).",
            f"TOML files are UTF-8: re-save {path} as UTF-8.",
        ) from None
    except OSError as exc:
        raise ConfigError(
            "CONFIG_INVALID",
            f"{path} cannot be read: {exc.strerror}",
            f"Check the permissions of {path}.",
        ) from None


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


def load_config() -> dict[str, dict[str, Any]]:
    """Resolve every setting: ``{variable: {"value", "source", "key"}}``.

    Raises ``ConfigError`` as :func:`resolve` does.
    """
    file_values = load_file_values()
    resolved = {}
    for setting in SETTINGS:
        value, source = resolve(setting.variable, file_values=file_values)
        resolved[setting.variable] = {"value": value, "source": source, "key": setting.file_key}
    return resolved
