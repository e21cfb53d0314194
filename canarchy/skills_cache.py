"""The local skills cache (``~/.canarchy/cache/skills``): provider manifests and listing.

Same layout and manifest format as the DBC cache (:mod:`canarchy.dbc_cache`, ``docs/caches-and-sessions.md``),
with its own ``[skills_cache]`` table. ``_CACHE_ROOT`` and ``_CONFIG_PATH`` are bound at import on purpose
(the test harness re-points them) and read when :func:`list_cache` runs. An entry whose path resolves outside
the cache root is not listed; a ``SKILLS_CACHE_PATH_ESCAPE`` warning names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from canarchy.dbc_cache import describe_cache

_CACHE_ROOT = Path.home() / ".canarchy" / "cache" / "skills"
_CONFIG_PATH = Path.home() / ".canarchy" / "config.toml"

_PREFIX = "SKILLS"
_CONFIG_TABLE = "skills_cache"


def list_cache() -> tuple[dict[str, Any], list[str]]:
    """List the skills cache at ``_CACHE_ROOT`` (read now).

    Returns ``(data, warnings)`` with data ``{"cache_root": str, "providers":
    [...], "provider_count": int, "default_provider": str or None}``; the
    provider shape and the warnings (``SKILLS_MANIFEST_INVALID``,
    ``SKILLS_CACHE_PATH_ESCAPE``) are those of
    :func:`canarchy.dbc_cache.scan_cache`. An empty or missing root lists zero
    providers. Raises ``ConfigError`` when ``_CONFIG_PATH`` is invalid.
    """
    return describe_cache(_CACHE_ROOT, _CONFIG_PATH, _CONFIG_TABLE, _PREFIX)
