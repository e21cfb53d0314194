"""The local DBC cache (``~/.canarchy/cache/dbc/``): provider manifests, listing and pruning.

Layout, manifest format and the ``[dbc_cache]`` table: ``docs/caches-and-sessions.md``. ``_CACHE_ROOT`` and
``_CONFIG_PATH`` are bound at import on purpose (the test harness re-points them); every function reads them
from this module when called. :func:`scan_cache`, :func:`read_manifest` and :func:`read_cache_settings` are
shared with :mod:`canarchy.skills_cache` (same layout, another root and code prefix).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from datetime import datetime
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from canarchy.errors import ConfigError, DecodeError, UserInputError

_CACHE_ROOT = Path.home() / ".canarchy" / "cache" / "dbc"
_CONFIG_PATH = Path.home() / ".canarchy" / "config.toml"

_PREFIX = "DBC"
_CONFIG_TABLE = "dbc_cache"

_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def is_valid_name(name: Any) -> bool:
    """True for a provider, commit or session name usable as one path component.

    Letters, digits, ``-``, ``_``, ``.``; 1..128 characters; not starting with
    ``.`` (so never ``.`` or ``..``) and no path separator.
    """
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None


class ManifestError(ValueError):
    """A manifest that is missing, unreadable or does not match the format."""


def _inside(path: Path, root_resolved: Path) -> tuple[bool, Path | None]:
    """Resolve ``path`` (following symlinks); return (inside root?, resolved path)."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # symlink loop (RuntimeError before 3.13)
        return False, None
    return resolved == root_resolved or resolved.is_relative_to(root_resolved), resolved


def validate_manifest(document: Any, provider: str) -> dict[str, Any]:
    """Check a parsed manifest against the format; return it normalised.

    Returns ``{"provider", "repository" (str or None), "commit", "fetched_at",
    "files": [{"path", "sha256", "bytes"}]}``. ``provider`` is the directory
    name the manifest was found in; the manifest must name the same provider.
    Raises :class:`ManifestError` with the first problem found.
    """
    _check_manifest_header(document, provider)
    return {
        "provider": provider,
        "repository": document.get("repository"),
        "commit": document["commit"],
        "fetched_at": document["fetched_at"],
        "files": _manifest_entries(document["files"]),
    }


def _check_manifest_header(document: Any, provider: str) -> None:
    """Check a manifest's top-level keys (everything but the ``files`` entries)."""
    if not isinstance(document, dict):
        raise ManifestError(f"expected a JSON object, got {type(document).__name__}")
    for key in ("provider", "commit", "fetched_at", "files"):
        if key not in document:
            raise ManifestError(f"missing key {key!r}")
    if document["provider"] != provider:
        raise ManifestError(f"'provider' is {document['provider']!r} but the directory is {provider!r}")
    repository = document.get("repository")
    if repository is not None and not isinstance(repository, str):
        raise ManifestError("'repository' must be a string")
    commit = document["commit"]
    if not is_valid_name(commit):
        raise ManifestError(f"'commit' must be a plain directory name (letters, digits, . _ -), got {commit!r}")
    fetched_at = document["fetched_at"]
    if not isinstance(fetched_at, str):
        raise ManifestError("'fetched_at' must be an ISO 8601 string")
    try:
        datetime.fromisoformat(fetched_at)
    except ValueError:
        raise ManifestError(f"'fetched_at' is not an ISO 8601 timestamp: {fetched_at!r}") from None
    if not isinstance(document["files"], list):
        raise ManifestError("'files' must be a list")


def _manifest_entries(files: list[Any]) -> list[dict[str, Any]]:
    """The checked ``files`` entries as ``[{"path", "sha256", "bytes"}]``; a path may appear once."""
    entries = []
    seen: set[str] = set()
    for index, entry in enumerate(files):
        where = f"files[{index}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where} must be an object")
        path, sha256, size = entry.get("path"), entry.get("sha256"), entry.get("bytes")
        if not isinstance(path, str) or not path:
            raise ManifestError(f"{where}.path must be a non-empty string")
        if path in seen:
            raise ManifestError(f"{where}.path {path!r} is listed twice")
        seen.add(path)
        if not isinstance(sha256, str) or _SHA256_RE.fullmatch(sha256) is None:
            raise ManifestError(f"{where}.sha256 must be 64 lower-case hex digits")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ManifestError(f"{where}.bytes must be an integer >= 0")
        entries.append({"path": path, "sha256": sha256, "bytes": size})
    return entries


def read_manifest(provider_dir: Path) -> dict[str, Any]:
    """Read and validate ``<provider_dir>/manifest.json`` (see :func:`validate_manifest`).

    Raises :class:`ManifestError` when the file is missing, unreadable, not
    JSON or not a valid manifest.
    """
    path = provider_dir / "manifest.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError("no manifest.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"cannot be read: {exc}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"not valid JSON: {exc}") from None
    return validate_manifest(document, provider_dir.name)


def _escape_reason(rel: str) -> str | None:
    """Why a manifest file path is not a plain relative path, or None."""
    if "\\" in rel or PureWindowsPath(rel).drive:
        return "is not a relative POSIX path"
    pure = PurePosixPath(rel)
    if pure.is_absolute():
        return "is an absolute path"
    if ".." in pure.parts:
        return "contains '..'"
    return None


def read_cache_settings(config_path: Path, table: str) -> dict[str, Any]:
    """Read the optional ``[<table>]`` table of the config file.

    Returns ``{"default_provider": str or None}``; a missing file or table
    reads as the defaults. Raises ``ConfigError`` (``CONFIG_INVALID``) naming
    the file when it does not parse, the table is not a table or
    ``default_provider`` is not a provider name.
    """
    from canarchy.config import read_config_file

    document = read_config_file(config_path)
    section = document.get(table, {})
    if not isinstance(section, dict):
        raise ConfigError(
            "CONFIG_INVALID",
            f"{config_path}: [{table}] must be a table, got {section!r}.",
            f"Write it as a `[{table}]` section in {config_path}.",
        )
    default_provider = section.get("default_provider")
    if default_provider is not None and not is_valid_name(default_provider):
        raise ConfigError(
            "CONFIG_INVALID",
            f"Invalid value {default_provider!r} for {table}.default_provider in {config_path}.",
            f"Set {table}.default_provider to a provider name (letters, digits, . _ -) or remove it.",
        )
    return {"default_provider": default_provider}


def scan_cache(root: Path, prefix: str) -> tuple[list[dict[str, Any]], list[str]]:
    """List the providers cached under ``root``; never raises for bad cache contents.

    Returns ``(providers, warnings)``. Each provider is ``{"provider",
    "repository", "commit", "fetched_at", "manifest" (path), "file_count",
    "bytes", "files": [{"path", "sha256", "bytes", "present"}]}``, sorted by
    name; ``bytes`` sums the listed entries' manifest sizes and ``present``
    says whether the file exists under ``files/<commit>/``.

    Problems become warnings that start with a code and name the file:
    ``<prefix>_MANIFEST_INVALID`` (missing, unreadable or malformed manifest:
    the provider is skipped) and ``<prefix>_CACHE_PATH_ESCAPE`` (a provider
    directory, manifest or file entry that resolves outside ``root`` —
    absolute, ``..`` or via a symlink: refused, not listed). Directories whose
    names start with ``.`` (in-progress downloads) are ignored.
    """
    providers_dir = root / "providers"
    if not providers_dir.is_dir():
        return [], []
    root_resolved = root.resolve()
    providers: list[dict[str, Any]] = []
    warnings: list[str] = []
    for provider_dir in sorted(providers_dir.iterdir(), key=lambda p: p.name):
        if provider_dir.name.startswith(".") or not provider_dir.is_dir():
            continue
        inside, resolved = _inside(provider_dir / "manifest.json", root_resolved)
        if not inside:
            warnings.append(
                f"{prefix}_CACHE_PATH_ESCAPE: {provider_dir / 'manifest.json'} resolves to {resolved}, "
                f"outside the cache root {root}; provider {provider_dir.name!r} not listed."
            )
            continue
        try:
            manifest = read_manifest(provider_dir)
        except ManifestError as exc:
            warnings.append(f"{prefix}_MANIFEST_INVALID: {provider_dir / 'manifest.json'}: {exc}; provider skipped.")
            continue
        files_dir = provider_dir / "files" / manifest["commit"]
        listed = []
        for entry in manifest["files"]:
            reason = _escape_reason(entry["path"])
            target = files_dir / entry["path"]
            if reason is None:
                inside, resolved = _inside(target, root_resolved)
                if not inside:
                    reason = f"resolves to {resolved}, outside the cache root {root}"
            if reason is not None:
                warnings.append(
                    f"{prefix}_CACHE_PATH_ESCAPE: {provider_dir / 'manifest.json'}: file entry "
                    f"{entry['path']!r} {reason}; refused, not listed."
                )
                continue
            listed.append({**entry, "present": target.is_file()})
        providers.append({
            "provider": manifest["provider"],
            "repository": manifest["repository"],
            "commit": manifest["commit"],
            "fetched_at": manifest["fetched_at"],
            "manifest": str(provider_dir / "manifest.json"),
            "file_count": len(listed),
            "bytes": sum(entry["bytes"] for entry in listed),
            "files": listed,
        })
    return providers, warnings


def describe_cache(root: Path, config_path: Path, table: str, prefix: str) -> tuple[dict[str, Any], list[str]]:
    """List a provider cache at ``root`` (shared by the DBC and skills caches).

    Returns ``(data, warnings)`` with data ``{"cache_root": str, "providers":
    [...], "provider_count": int, "default_provider": str or None}``; the
    provider shape and warnings are those of :func:`scan_cache`. Raises
    ``ConfigError`` when ``config_path`` is invalid.
    """
    settings = read_cache_settings(config_path, table)
    providers, warnings = scan_cache(root, prefix)
    return {
        "cache_root": str(root),
        "providers": providers,
        "provider_count": len(providers),
        "default_provider": settings["default_provider"],
    }, warnings


def list_cache() -> tuple[dict[str, Any], list[str]]:
    """List the DBC cache at ``_CACHE_ROOT`` (read now).

    Returns ``(data, warnings)`` with data ``{"cache_root": str, "providers":
    [...], "provider_count": int, "default_provider": str or None}`` (provider
    shape: :func:`scan_cache`). An empty or missing root lists zero providers.
    Raises ``ConfigError`` when ``_CONFIG_PATH`` is invalid.
    """
    return describe_cache(_CACHE_ROOT, _CONFIG_PATH, _CONFIG_TABLE, _PREFIX)


def _tree_bytes(path: Path) -> int:
    """Sum of regular-file sizes under ``path`` (symlinks are not followed)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames:
            path_name = os.path.join(dirpath, name)
            try:
                if not os.path.islink(path_name):
                    total += os.lstat(path_name).st_size
            except OSError:
                continue
    return total


def _prune_provider(provider_dir: Path, root: Path, root_resolved: Path,
                    manifest: dict[str, Any]) -> tuple[list[str], int, list[str]]:
    """Remove everything under ``files/`` except the current commit; returns (removed, bytes, warnings)."""
    removed: list[str] = []
    freed = 0
    warnings: list[str] = []
    files_dir = provider_dir / "files"
    if not files_dir.is_dir():
        return removed, freed, warnings
    inside, resolved = _inside(files_dir, root_resolved)
    if not inside:
        warnings.append(
            f"{_PREFIX}_CACHE_PATH_ESCAPE: {files_dir} resolves to {resolved}, outside the cache root {root}; "
            "nothing removed."
        )
        return removed, freed, warnings
    for entry in sorted(files_dir.iterdir(), key=lambda p: p.name):
        if entry.name == manifest["commit"]:
            continue
        inside, resolved = _inside(entry, root_resolved)
        if not inside:
            warnings.append(
                f"{_PREFIX}_CACHE_PATH_ESCAPE: {entry} resolves to {resolved}, outside the cache root {root}; "
                "not removed."
            )
            continue
        try:
            if entry.is_symlink():
                # A link whose target stays inside the root: remove the link, never the target.
                entry.unlink()
                size = 0
            elif entry.is_dir():
                size = _tree_bytes(entry)
                # rmtree never follows symlinks inside the tree (it unlinks them).
                shutil.rmtree(entry)
            else:
                size = entry.lstat().st_size
                entry.unlink()
        except OSError as exc:
            warnings.append(f"{_PREFIX}_CACHE_PRUNE_FAILED: {entry}: {exc.strerror or exc}; not removed.")
            continue
        removed.append(str(entry))
        freed += size
    return removed, freed, warnings


def prune_cache(provider: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """Remove cached commits other than each manifest's current one under ``_CACHE_ROOT``.

    With ``provider``, only that provider. Returns ``(data, warnings)`` with
    data ``{"cache_root", "provider" (str or None), "removed": [paths],
    "removed_count", "bytes_freed"}`` (bytes of regular files removed).

    Nothing whose resolved path escapes the cache root is deleted (a symlinked
    provider, ``files`` directory or commit entry pointing outside is reported
    as a ``DBC_CACHE_PATH_ESCAPE`` warning); symlinks inside a removed commit
    are unlinked, never followed. Without ``provider``, a provider whose
    manifest is missing or malformed is skipped with a ``DBC_MANIFEST_INVALID``
    warning.

    Raises ``UserInputError``: ``INVALID_PROVIDER_NAME`` (not a plain name),
    ``DBC_PROVIDER_NOT_FOUND`` (no such provider directory), both exit 1;
    ``DecodeError`` ``DBC_MANIFEST_INVALID`` (exit 3) when the named
    provider's manifest is missing or malformed.
    """
    root = _CACHE_ROOT
    providers_dir = root / "providers"
    if provider is not None:
        if not is_valid_name(provider):
            raise UserInputError(
                "INVALID_PROVIDER_NAME",
                f"{provider!r} is not a provider name.",
                "A provider name uses letters, digits, '.', '_' and '-' only and does not start with '.'; "
                "run `canarchy dbc cache list` to see cached providers.",
            )
        if not (providers_dir / provider).is_dir():
            raise UserInputError(
                "DBC_PROVIDER_NOT_FOUND",
                f"No DBC provider {provider!r} is cached under {root}.",
                "Run `canarchy dbc cache list` to see cached providers.",
            )
        candidates = [providers_dir / provider]
    elif providers_dir.is_dir():
        candidates = sorted(
            (p for p in providers_dir.iterdir() if p.is_dir() and not p.name.startswith(".")),
            key=lambda p: p.name,
        )
    else:
        candidates = []
    root_resolved = root.resolve()
    removed: list[str] = []
    freed = 0
    warnings: list[str] = []
    for provider_dir in candidates:
        inside, resolved = _inside(provider_dir, root_resolved)
        if not inside:
            warnings.append(
                f"{_PREFIX}_CACHE_PATH_ESCAPE: {provider_dir} resolves to {resolved}, outside the cache root "
                f"{root}; nothing removed."
            )
            continue
        try:
            manifest = read_manifest(provider_dir)
        except ManifestError as exc:
            manifest_path = provider_dir / "manifest.json"
            if provider is not None:
                raise DecodeError(
                    "DBC_MANIFEST_INVALID",
                    f"{manifest_path}: {exc}.",
                    f"Fix or re-fetch {manifest_path}; without a valid manifest canarchy cannot tell "
                    "which commit is current, so it removes nothing.",
                ) from None
            warnings.append(f"{_PREFIX}_MANIFEST_INVALID: {manifest_path}: {exc}; provider skipped, nothing removed.")
            continue
        gone, size, problems = _prune_provider(provider_dir, root, root_resolved, manifest)
        removed.extend(gone)
        freed += size
        warnings.extend(problems)
    return {
        "cache_root": str(root),
        "provider": provider,
        "removed": removed,
        "removed_count": len(removed),
        "bytes_freed": freed,
    }, warnings
