"""The plugin's settings, for canarchy and for any project that adopts it (docs/adopting.md): its ini
options, and what the command line asks for (the ``-m`` expression's markers; an xdist worker)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

#: name -> (ini type, default, help). canarchy's own values are in its pyproject.toml.
OPTIONS: dict[str, tuple[str, object, str]] = {
    "canarchy_containment": ("bool", False, "enter private user and mount namespaces in which the operator's "
                             "guarded paths are empty and read-only and the real home cannot be written (Linux)"),
    "canarchy_network_namespace": ("bool", False, "also a private network namespace holding only loopback "
                                   "(Linux; skipped when -m asks for integration or real_bus tests)"),
    "canarchy_test_cwd": ("string", "empty", "each test's working directory: 'empty' (a fresh directory) or "
                          "'rootdir' (the project's root, for tests that open files by relative path)"),
    "canarchy_require_import": ("bool", False, "every test module must import canarchy.testing.required "
                                "(which refuses to import without the plugin)"),
    "canarchy_scrub_prefixes": ("args", ["CANARCHY_", "CAN_"], "environment variables removed from every test "
                                "(prefixes)"),
    "canarchy_keep_variables": ("args", [], "environment variables kept in every test even when they name a "
                                "file in the operator's home (prefixes; such variables are removed otherwise)"),
    "canarchy_guarded_paths": ("args", ["~/.canarchy", "~/.canrc", "~/can.conf", "~/.can", "/etc/can.conf"],
                               "the operator's state: never read or written by a test (~ is each real home)"),
    "canarchy_scan_packages": ("args", ["canarchy"], "packages whose import-time paths under the home are "
                               "re-pointed into each test's home"),
}


def add_options(parser: pytest.Parser) -> None:
    for name, (kind, default, text) in OPTIONS.items():
        parser.addini(name, type=kind, default=default, help=f"canarchy: {text}")  # type: ignore[arg-type]


@dataclass(frozen=True)
class Settings:
    """The options of one run, checked."""

    containment: bool
    network_namespace: bool
    test_cwd: str
    require_import: bool
    scrub_prefixes: tuple[str, ...]
    guarded_paths: tuple[str, ...]
    scan_packages: tuple[str, ...]
    keep_variables: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Raises ``pytest.UsageError`` naming the option for a value it cannot use."""
        test_cwd = config.getini("canarchy_test_cwd").strip()
        if test_cwd not in ("empty", "rootdir"):
            raise pytest.UsageError(f"canarchy_test_cwd = {test_cwd!r}: use 'empty' or 'rootdir'")
        prefixes = tuple(p for p in config.getini("canarchy_scrub_prefixes") if p)
        guarded = tuple(config.getini("canarchy_guarded_paths"))
        bad = [p for p in guarded if not (p.startswith("~/") or os.path.isabs(p))]
        if bad:
            raise pytest.UsageError(f"canarchy_guarded_paths: {', '.join(bad)}: give ~/... or an absolute path")
        return cls(bool(config.getini("canarchy_containment")), bool(config.getini("canarchy_network_namespace")),
                   test_cwd, bool(config.getini("canarchy_require_import")), prefixes, guarded,
                   tuple(config.getini("canarchy_scan_packages")),
                   tuple(p for p in config.getini("canarchy_keep_variables") if p))

    def guarded_under(self, homes: list[str]) -> list[str]:
        """The guarded paths, ``~`` expanded to each of ``homes``."""
        found: list[str] = []
        for path in self.guarded_paths:
            found += [str(Path(home) / path[2:]) for home in homes] if path.startswith("~/") else [path]
        return list(dict.fromkeys(found))


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _markexpr(config: pytest.Config) -> str:
    """The run's ``-m`` expression. The command line's known arguments first: at the earliest
    start (``pytest_load_initial_conftests``) ``config.option`` still holds the defaults."""
    known = getattr(config, "known_args_namespace", None)
    if known is not None and getattr(known, "markexpr", None):
        return known.markexpr
    try:
        return config.getoption("markexpr", "") or ""
    except (AttributeError, ValueError):
        return ""


_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def real_bus_asked(config: pytest.Config) -> list[str]:
    """The markers of tests that use a real bus (``integration``, ``real_bus``) that the run's ``-m`` asks for."""
    return [name for name in ("integration", "real_bus") if asks_for(_markexpr(config), name)]


def asks_for(markexpr: str, marker: str) -> bool:
    """Whether the ``-m`` expression ``markexpr`` asks for ``marker``: names it outside an odd
    number of ``not``. ``"integration"``, ``"real_bus or uds"`` and ``"not (uds and not
    real_bus)"`` ask for theirs; ``"uds"``, ``"not integration"`` and ``""`` do not. Follows
    pytest's ``-m`` grammar (``or``/``and``/``not``, parentheses, ``name(key=value)``); an
    expression that does not parse (pytest reports it) asks for a marker it contains as a word.
    """
    tokens = _TOKEN.findall(markexpr)
    position = 0
    found = False

    def atom(positive: bool) -> None:
        nonlocal position, found
        if position >= len(tokens):
            raise SyntaxError
        token = tokens[position]
        position += 1
        if token == "not":
            atom(not positive)
        elif token == "(":
            expression(positive)
            if position >= len(tokens) or tokens[position] != ")":
                raise SyntaxError
            position += 1
        elif token in (")", "and", "or"):
            raise SyntaxError
        else:
            name, _, arguments = token.partition("(")
            found = found or (positive and name == marker)
            if arguments or (position < len(tokens) and tokens[position] == "("):  # name(key=value, ...)
                depth = 1 if arguments else 0
                while position < len(tokens) and (depth or tokens[position] == "("):
                    depth += {"(": 1, ")": -1}.get(tokens[position], 0)
                    position += 1

    def expression(positive: bool) -> None:
        nonlocal position
        atom(positive)
        while position < len(tokens) and tokens[position] in ("and", "or"):
            position += 1
            atom(positive)

    try:
        expression(True)
        if position != len(tokens):
            raise SyntaxError
    except SyntaxError:
        return re.search(rf"(?<![\w.]){re.escape(marker)}(?![\w.])", markexpr) is not None
    return found
