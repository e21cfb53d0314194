"""Plugins: discovery through entry points (metadata only, nothing imported), state in
``~/.canarchy/config.toml`` (``[plugins.<name>] enabled``; installed but not enabled means
disabled). :func:`enabled_entry_points` is the one place later code asks which entry points
it may load; :func:`set_enabled` edits the file with tomlkit (comments and order kept),
checks the result and writes it atomically. Errors: ``ConfigError`` ``CONFIG_INVALID``,
``CONFIG_WRITE_FAILED``. Design and the entry-point groups: docs/plugins.md.
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from canarchy import config
from canarchy.errors import ConfigError
from canarchy.fileio import write_text_atomic

#: Entry point groups canarchy discovers, in listing order.
GROUPS = ("canarchy.processors", "canarchy.decoders", "canarchy.transports")

# The installed distributions, in sys.path order (a name tests may confine to their own directory).
_distributions = metadata.distributions


@dataclass(frozen=True)
class PluginEntryPoint:
    """One entry point of a plugin: ``group``, ``value`` (``module:attr``), and the
    ``distribution`` (name) and ``version`` that declare it (None when the metadata lacks them)."""

    group: str
    value: str
    distribution: str | None
    version: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "value": self.value, "distribution": self.distribution,
                "version": self.version}


@dataclass
class Plugin:
    """A plugin as ``plugins list`` shows it.

    ``installed``: at least one entry point was discovered; ``enabled``: the
    configured state (False when not configured); ``state_source``:
    ``"config"`` (an ``enabled`` key exists) or ``"default"``.
    """

    name: str
    entry_points: list[PluginEntryPoint] = field(default_factory=list)
    enabled: bool = False
    state_source: str = "default"

    @property
    def installed(self) -> bool:
        return bool(self.entry_points)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "installed": self.installed,
            "enabled": self.enabled,
            "state_source": self.state_source,
            "groups": sorted({ep.group for ep in self.entry_points}, key=GROUPS.index),
            "entry_points": [ep.to_dict() for ep in self.entry_points],
        }


def _normalized(name: str) -> str:
    # PEP 503 normalisation, as importlib.metadata uses to drop shadowed distributions.
    return re.sub(r"[-_.]+", "-", name).lower()


def discover() -> tuple[dict[str, list[PluginEntryPoint]], list[str]]:
    """Find the entry points of :data:`GROUPS`; import nothing.

    Returns ``({plugin name: [PluginEntryPoint, ...]}, warnings)``. The
    selection is that of ``importlib.metadata.entry_points(group=...)`` (the
    first distribution of a name on ``sys.path`` wins), but a distribution
    whose metadata cannot be read is a warning naming it, not a failure of
    the whole listing.
    """
    found: dict[str, list[PluginEntryPoint]] = {}
    warnings: list[str] = []
    seen: set[str] = set()
    for dist in _distributions():
        name = dist.metadata["Name"] if dist.metadata is not None else None
        key = _normalized(name) if name else None
        if key is not None:
            if key in seen:
                continue  # shadowed by an earlier copy on sys.path
            seen.add(key)
        try:
            entry_points = list(dist.entry_points)
        except Exception as exc:  # malformed entry_points.txt: one bad package must not hide the rest
            where = getattr(dist, "_path", None) or name or "a distribution"
            warnings.append(f"cannot read the entry points of {where}: {exc.__class__.__name__}: {exc}")
            continue
        version = dist.metadata["Version"] if dist.metadata is not None else None
        for ep in entry_points:
            if ep.group in GROUPS:
                found.setdefault(ep.name, []).append(PluginEntryPoint(ep.group, ep.value, name, version))
    for plugin_name, eps in found.items():
        eps.sort(key=lambda ep: (GROUPS.index(ep.group), ep.distribution or "", ep.value))
        for group in GROUPS:
            owners = {ep.distribution for ep in eps if ep.group == group}
            if len(owners) > 1:
                warnings.append(f"plugin {plugin_name!r} is declared in {group} by more than one distribution "
                                f"({', '.join(sorted(o or '?' for o in owners))}); enabling it enables all of them")
    return found, warnings


# --- the config file --------------------------------------------------------------------------


def _parse(path: Path, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("CONFIG_INVALID", f"{path} is not valid TOML: {exc}",
                          f"Fix the syntax of {path} or move it aside; it was not changed.") from None


def _plugin_tables(path: Path, document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tables = document.get("plugins", {})
    if not isinstance(tables, dict):
        raise ConfigError("CONFIG_INVALID", f"{path}: `plugins` must be a table, got {tables!r}.",
                          f"Write plugin state as `[plugins.<name>]` tables in {path}.")
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError("CONFIG_INVALID", f"{path}: `plugins.{name}` must be a table, got {table!r}.",
                              f"Write it as `[plugins.{name}]` with `enabled = true` or `false`.")
        if "enabled" in table and not isinstance(table["enabled"], bool):
            raise ConfigError("CONFIG_INVALID",
                              f"{path}: `plugins.{name}.enabled` must be true or false, got {table['enabled']!r}.",
                              f"Set it to true or false, or run `canarchy plugins enable|disable {name}`.")
    return tables


def configured_states(path: Path | None = None) -> dict[str, bool | None]:
    """``{plugin name: enabled}`` from the config file's ``[plugins.*]`` tables (None: a table
    without ``enabled``). A missing file reads as ``{}``. Raises ``ConfigError`` ``CONFIG_INVALID``."""
    path = config.config_path() if path is None else path
    text = config.read_config_text(path)
    if text is None:
        return {}
    tables = _plugin_tables(path, _parse(path, text))
    return {name: table.get("enabled") for name, table in tables.items()}


def list_plugins(path: Path | None = None) -> tuple[list[Plugin], list[str]]:
    """Discovered plugins plus configured-but-not-installed ones, sorted by name, and the
    discovery warnings. Raises ``ConfigError`` as :func:`configured_states`."""
    states = configured_states(path)
    found, warnings = discover()
    plugins = []
    for name in sorted(set(found) | set(states)):
        state = states.get(name)
        plugins.append(Plugin(name, found.get(name, []), enabled=bool(state),
                              state_source="default" if state is None else "config"))
    return plugins, warnings


def enabled_entry_points(group: str, path: Path | None = None) -> list[metadata.EntryPoint]:
    """The entry points of ``group`` whose plugin is enabled in the config file (not loaded:
    the caller decides when to ``.load()``). Raises ``ConfigError`` as :func:`configured_states`;
    ``ValueError`` for a group outside :data:`GROUPS`."""
    if group not in GROUPS:
        raise ValueError(f"unknown plugin group {group!r}; expected one of {GROUPS}")
    states = configured_states(path)
    return [ep for ep in metadata.entry_points(group=group) if states.get(ep.name) is True]


def set_enabled(name: str, enabled: bool, path: Path | None = None) -> dict[str, Any]:
    """Set ``[plugins.<name>] enabled`` in the config file, keeping everything else byte for byte.

    Creates the file (and ``~/.canarchy``) when missing. Writes nothing when
    the value is already set. Returns ``{config_path, previous (bool or
    None), enabled, changed}``.

    Raises ``ConfigError``: ``CONFIG_INVALID`` when the file does not parse or
    its plugin tables have the wrong type (the file is untouched),
    ``CONFIG_WRITE_FAILED`` when it cannot be written safely.
    """
    import tomlkit  # imported here: only `plugins enable|disable` writes TOML

    path = config.config_path() if path is None else path
    text = config.read_config_text(path)
    original = _parse(path, text) if text is not None else {}
    tables = _plugin_tables(path, original)
    previous = tables.get(name, {}).get("enabled")
    result = {"config_path": str(path), "previous": previous, "enabled": enabled, "changed": previous is not enabled}
    if previous is enabled:
        return result
    try:
        document = tomlkit.parse(text or "")
        _edit(tomlkit, document, name, enabled)
        new_text = document.as_string()
    except Exception as exc:  # tomlkit disagrees with tomllib about this file, or cannot place the key
        raise _write_failed(path, name, enabled, f"tomlkit could not edit it: {exc}") from None
    if new_text.endswith("\n\n") and not (text or "").endswith("\n\n"):
        new_text = new_text[:-1]  # the blank line added after a new table is not wanted at the end of the file
    expected = copy.deepcopy(original)
    expected.setdefault("plugins", {}).setdefault(name, {})["enabled"] = enabled
    try:
        check = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError as exc:
        raise _write_failed(path, name, enabled, f"the edited file would not parse: {exc}") from None
    if check != expected:
        raise _write_failed(path, name, enabled, "the edit would have changed other settings")
    _atomic_write(path, new_text)
    return result


def _edit(tomlkit: Any, document: Any, name: str, enabled: bool) -> None:
    """Set ``plugins.<name>.enabled`` in a tomlkit document, in whatever form the tables take."""
    from tomlkit.items import InlineTable

    plugins = document.get("plugins")
    if plugins is None:
        plugins = tomlkit.table(is_super_table=True)
        plugins[name] = _new_table(tomlkit, enabled)
        document["plugins"] = plugins
        return
    table = plugins.get(name)
    if table is not None:
        table["enabled"] = enabled
    elif isinstance(plugins, InlineTable):
        inline = tomlkit.inline_table()
        inline["enabled"] = enabled
        plugins[name] = inline
    else:
        plugins[name] = _new_table(tomlkit, enabled)


def _new_table(tomlkit: Any, enabled: bool) -> Any:
    table = tomlkit.table()
    table.add("enabled", enabled)
    table.add(tomlkit.nl())  # a blank line before whatever table follows
    return table


def _write_failed(path: Path, name: str, enabled: bool, why: str) -> ConfigError:
    value = "true" if enabled else "false"
    return ConfigError("CONFIG_WRITE_FAILED", f"{path} was not changed: {why}.",
                       f"Edit it by hand: add `[plugins.{name}]` with `enabled = {value}`.")


def _atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (:class:`canarchy.fileio.PendingFile`: a symlinked config file
    stays a symlink, the file keeps its permission bits). Raises ``ConfigError`` ``CONFIG_WRITE_FAILED``;
    on failure the old file is intact and no temporary file is left behind.
    """
    directory = Path(os.path.realpath(path)).parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    except OSError as exc:
        raise ConfigError("CONFIG_WRITE_FAILED", f"Cannot write {path}: {exc.strerror or exc}; it was not changed.",
                          f"Check that {directory} exists and is writable, and its free space.") from None
