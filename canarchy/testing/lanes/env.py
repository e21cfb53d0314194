"""Lane environments and the posargs policy: the one entry nox loads.

Standard library only, so nox's own interpreter can load this file by path
without the project's dependencies (``noxfile.py``); everything else of the
lanes runs inside a lane's virtualenv. Design: docs/design/verification-harness.md §1.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Iterable, Mapping, Sequence

#: Variables a lane copies from the caller: what programs need to run and to
#: print, nothing that can change what a test decides (the time zone and the
#: locale can: :data:`NEUTRAL_ENV` fixes them, and the parity lane's operator
#: twin sets others, :data:`HOSTILE_ENV`).
ALLOWED_VARIABLES = (
    "PATH",
    "TERM",
    "NO_COLOR",
    "TMPDIR",
    "TEMP",
    "TMP",
    # Windows: the C runtime and sockets need these.
    "SYSTEMROOT",
    "SYSTEMDRIVE",
    "WINDIR",
    "COMSPEC",
    "PATHEXT",
)
ALLOWED_PREFIXES: tuple[str, ...] = ()
#: The time zone and locale of every lane's run, whoever starts it: UTC, C with UTF-8.
NEUTRAL_ENV = {"TZ": "UTC", "LANG": "C.UTF-8"}

#: Flags every lane's pytest gets; posargs can only choose tests (:func:`choose_tests`).
SAFETY_FLAGS = ("--strict-markers", "--strict-config")

#: The homes of the lane's caller, for the plugin (``protection.OPERATOR_HOMES_VARIABLE``: this module imports
#: nothing of canarchy's).
OPERATOR_HOMES_VARIABLE = "PYTEST_CANARCHY_OPERATOR_HOMES"
#: The variables through which an operator names a real bus for the integration lane.
OPERATOR_BUS_VARIABLES = ("CANARCHY_PYTHON_CAN_INTERFACE", "CANARCHY_DEFAULT_INTERFACE")

#: The shell the configured parity twin runs in: every variable canarchy or
#: python-can reads, set to values that would change an unisolated result.
#: Paths that point into the operator home use ``{home}``.
HOSTILE_ENV: dict[str, str] = {
    "CANARCHY_TRANSPORT_BACKEND": "python-can",
    "CANARCHY_PYTHON_CAN_INTERFACE": "udp_multicast",
    "CANARCHY_DEFAULT_INTERFACE": "can9",
    "CANARCHY_CAPTURE_LIMIT": "7",
    "CANARCHY_CAPTURE_TIMEOUT": "0.5",
    "CANARCHY_REQUIRE_ACTIVE_ACK": "1",
    "CANARCHY_MCP_NONINTERACTIVE_ACK": "1",
    "CANARCHY_J1939_DBC": "{home}/.canarchy/cache/dbc/providers/opendbc/files/"
    "3f1c2a9e5b7d4c6f8a0b1c2d3e4f5a6b7c8d9e0f/j1939_operator.dbc",
    "CANARCHY_J1939_SPN_OVERRIDES": "{home}/.canarchy/j1939_spns.json",
    "CANARCHY_J1587_PID_OVERRIDES": "{home}/.canarchy/j1587_pids.json",
    "CANARCHY_J2497_MID_OVERRIDES": "{home}/.canarchy/j2497_mids.json",
    "CAN_INTERFACE": "socketcan",
    "CAN_CHANNEL": "can0",
    "CAN_BITRATE": "500000",
    "CAN_CONFIG": '{"receive_own_messages": true}',
    "CAN_INTERFACE_X": "udp_multicast",
    "CAN_CHANNEL_X": "can1",
    "CAN_CONFIG_X": '{"fd": true}',
    "XDG_CONFIG_HOME": "{home}/.config",
    "XDG_CACHE_HOME": "{home}/.cache",
    # An operator's clock and language: a zone 3 h 30 min behind UTC (a POSIX rule: no tz database needed), German.
    "TZ": "NST+3:30",
    "LANG": "de_DE.UTF-8",
}


def hostile_env(home: str | os.PathLike[str]) -> dict[str, str]:
    """:data:`HOSTILE_ENV` with its ``{home}`` paths pointing into ``home`` (an operator home)."""
    return {name: value.replace("{home}", os.fspath(home)) for name, value in HOSTILE_ENV.items()}


def build_env(
    *,
    home: str | os.PathLike[str],
    hashseed: int | str = 0,
    extra: Mapping[str, str] | None = None,
    passthrough: Iterable[str] = (),
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return a lane environment built from an allow-list, not from the caller's shell.

    ``source`` (default ``os.environ``) supplies only :data:`ALLOWED_VARIABLES`
    and the names in ``passthrough`` (copied when set); the time zone and locale
    are :data:`NEUTRAL_ENV`'s; ``home`` becomes ``HOME`` and ``USERPROFILE``, the
    caller's go to :data:`OPERATOR_HOMES_VARIABLE` (kept from an outer lane);
    ``extra`` is applied last and wins.

    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``: a lane's pytest loads the plugins the
    project names (``pytest_plugins`` in a conftest, ``-p``) and none of the
    ``pytest11`` entry points that happen to be installed in the interpreter
    (an operator's pytest-benchmark makes ``.benchmarks/`` in the checkout,
    pytest-randomly reorders tests), so a verdict does not depend on them.
    Children a test starts with its own environment decide for themselves.
    """
    source = os.environ if source is None else source
    env = {
        name: value
        for name, value in source.items()
        if name in ALLOWED_VARIABLES or name.startswith(ALLOWED_PREFIXES)
    }
    env.update(NEUTRAL_ENV)
    for name in passthrough:
        if name in source:
            env[name] = source[name]
    # the homes of whoever started the lane (the outermost caller's), which the plugin protects as the
    # operator's though HOME names the lane's own: one a shell, a container or a CI job moved from the account's
    callers = source.get(OPERATOR_HOMES_VARIABLE) or os.pathsep.join(
        dict.fromkeys(source[name] for name in ("HOME", "USERPROFILE") if source.get(name)))
    if callers:
        env[OPERATOR_HOMES_VARIABLE] = callers
    env["HOME"] = os.fspath(home)
    env["USERPROFILE"] = os.fspath(home)
    env["PYTHONHASHSEED"] = str(hashseed)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.update(extra or {})
    return env


#: Options posargs may pass to a lane: they choose tests and nothing else.
SELECTION_OPTIONS = ("-k", "-m", "--deselect")


def lane_options(args: Sequence[str], *, flags: tuple[str, ...] = (),
                 valued: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """``(the lane's own options, the rest)`` of a nox session's posargs: ``flags`` alone, ``valued`` as
    ``--name V`` or ``--name=V`` (a missing value as "", for the lane's parser to refuse)."""
    own: list[str] = []
    rest: list[str] = []
    args = list(args)
    while args:
        token = args.pop(0)
        if token in flags:
            own.append(token)
        elif token.split("=", 1)[0] in valued:
            own += [token] if "=" in token else [token, args.pop(0) if args else ""]
        else:
            rest.append(token)
    return own, rest


def choose_tests(
    posargs: Sequence[str],
    *,
    fixed_markexpr: str | None = None,
    default: str | Sequence[str] = "tests",
    root: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Check a lane's posargs and return pytest's test selection.

    Accepted: paths and node ids inside the checkout ``root`` (default: the
    working directory; a test file elsewhere would run without this
    project's conftest and so without its isolation), ``-k EXPR``, ``-m
    EXPR`` (not when the lane fixes ``-m`` itself, and never naming
    ``integration`` outside that lane), ``--deselect ID``, each with a
    separate or ``=`` value. Without a path the selection is ``default``.
    Raises ``ValueError`` naming the refused token, so posargs can never
    switch a safety flag off, move the JUnit report or leave the checkout.
    """
    base = Path(os.getcwd() if root is None else root).resolve()
    args, options, paths = list(posargs), [], []
    while args:
        token = args.pop(0)
        if token.startswith("@"):
            raise ValueError(f"{token!r}: pytest would read arguments from that file; give them on the command line")
        if not token.startswith("-"):
            target = (base / token.split("::", 1)[0]).resolve()
            if target != base and base not in target.parents:
                raise ValueError(f"posargs choose tests of this checkout ({base}); {token!r} is outside it")
            paths.append(token)
            continue
        option, has_value, value = token.partition("=")
        if option not in SELECTION_OPTIONS or (option == "-m" and fixed_markexpr is not None):
            raise ValueError(
                f"posargs only choose tests (paths, node ids, -k, -m, --deselect); {token!r} is not allowed "
                "in this lane"
            )
        if not has_value:
            if not args:
                raise ValueError(f"{token} needs a value")
            value = args.pop(0)
        if value.startswith("@"):
            raise ValueError(f"{value!r}: pytest would read arguments from that file; give them on the command line")
        if option == "-m" and "integration" in value:
            raise ValueError("integration tests run in their own lane: nox -s integration")
        if option == "-m" and ("real_bus" in value or "real_home" in value):
            raise ValueError("real_bus and real_home tests reach the operator's bus or home: no lane runs them; "
                             "run them by hand (python -m pytest -m real_bus)")
        options += [option, value]
    return [*options, *(paths or ([default] if isinstance(default, str) else list(default)))]


