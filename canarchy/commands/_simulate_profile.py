"""A simulated ECU's profile file (TOML or JSON) read and checked into a :class:`~canarchy.uds_server.EcuProfile`.

One file is one ECU, or a network of them under ``ecus``; the keys are listed in
``docs/generate-and-simulate.md``. Every error is ``UserInputError`` ``SIMULATOR_PROFILE_INVALID``, naming the file
and the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from canarchy.commands._common import parse_hex_data, parse_int
from canarchy.errors import UserInputError
from canarchy.fileio import UnreadableFile, read_small_text
from canarchy.uds import NEGATIVE_RESPONSE_SID

#: Keys a profile may have (anything else is a typo, reported as such).
PROFILE_KEYS = ("request_id", "response_id", "services", "nrc", "dids", "writable_dids", "security",
                "pending", "delays", "padding", "silent")
_SECURITY_KEYS = ("seed", "key", "max_attempts", "lockout")


def _invalid(path: str, message: str, hint: str | None = None) -> UserInputError:
    return UserInputError("SIMULATOR_PROFILE_INVALID", f"Profile {path}: {message}",
                          hint or "See docs/generate-and-simulate.md for the profile keys and their values.")


def _int(path: str, where: str, raw: Any, lo: int, hi: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise _invalid(path, f"{where} must be an integer or a \"0x..\" string, got {raw!r}.")
    if isinstance(raw, int):
        if not lo <= raw <= hi:
            raise _invalid(path, f"{where} = {raw} is outside 0x{lo:X}..0x{hi:X}.")
        return raw
    try:
        return parse_int(raw, "SIMULATOR_PROFILE_INVALID", where, lo, hi, "-")
    except UserInputError as exc:
        raise _invalid(path, exc.message) from None


def _seconds(path: str, where: str, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= 60:
        raise _invalid(path, f"{where} must be a number of seconds 0..60, got {raw!r}.")
    return float(raw)


def _hex(path: str, where: str, raw: Any, max_bytes: int) -> bytes:
    if not isinstance(raw, str):
        raise _invalid(path, f"{where} must be a hex string, got {raw!r}.")
    try:
        value = parse_hex_data(raw, max_bytes=max_bytes)
    except UserInputError as exc:
        raise _invalid(path, f"{where}: {exc.message}") from None
    if not value:
        raise _invalid(path, f"{where} is empty.")
    return value


def _table(path: str, document: dict[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key, {})
    if not isinstance(value, dict):
        raise _invalid(path, f"`{key}` must be a table (TOML) or an object (JSON), got {value!r}.")
    return value


def _sid_list(path: str, key: str, raw: Any, lo: int, hi: int) -> frozenset[int]:
    if not isinstance(raw, list):
        raise _invalid(path, f"`{key}` must be a list, got {raw!r}.")
    return frozenset(_int(path, f"{key}[{i}]", item, lo, hi) for i, item in enumerate(raw))


def read_profile_document(path: str) -> dict[str, Any]:
    """Read a profile file as a dict: ``.toml`` with tomllib, ``.json`` with json.

    Raises ``UserInputError`` ``SIMULATOR_PROFILE_INVALID`` when it is missing,
    unreadable, of another suffix, does not parse, or is not a table/object.
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise _invalid(path, f"suffix {suffix or '(none)'!r} is neither .toml nor .json.",
                       "Write the profile as TOML (.toml) or JSON (.json).")
    try:
        text = read_small_text(target)
    except UnreadableFile as exc:
        raise _invalid(path, f"the file {exc.reason}.", exc.hint) from None
    if text is None:
        raise _invalid(path, "the file does not exist.", "Check the path given to --profile.")
    try:
        if suffix == ".toml":
            import tomllib

            document = tomllib.loads(text)
        else:
            document = json.loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        raise _invalid(path, f"it does not parse as {suffix[1:].upper()}: {exc}.",
                       f"Fix the {suffix[1:].upper()} syntax at the place named.") from None
    if not isinstance(document, dict):
        raise _invalid(path, "the top level must be a table/object.")
    return document


def load_profile(path: str | None) -> tuple[Any, int | None, int | None]:
    """Build the ECU's :class:`~canarchy.simulator.EcuProfile` from a profile file.

    Returns ``(profile, request_id, response_id)`` (the IDs None when the file
    does not give them). Without a file: the built-in profile. A key the file
    gives replaces that default; keys it omits keep the default.

    Keys (integers as TOML integers or ``"0x.."`` strings; JSON object keys are
    strings): ``request_id``, ``response_id`` (arbitration IDs);
    ``services`` (list of supported SIDs; others get NRC 0x11); ``nrc`` (SID ->
    NRC returned for every request of that SID); ``dids`` (DID -> value: a text
    string, stored as its UTF-8 bytes, or ``{hex = "..."}``); ``writable_dids``
    (DIDs 0x2E may write); ``security`` (``seed``, ``key``: hex;
    ``max_attempts``; ``lockout``: seconds); ``pending`` (SID -> seconds
    before the settled reply, after 0x78); ``delays`` (SID -> seconds before
    the reply); ``padding`` (byte, or false for unpadded frames). ISO 14229-1
    names the services and NRCs.

    Raises ``UserInputError`` ``SIMULATOR_PROFILE_INVALID`` naming the file and the key.
    """
    from canarchy.simulator import EcuProfile

    if path is None:
        return EcuProfile(), None, None
    return _profile_from(path, read_profile_document(path))


def load_ecus(path: str | None) -> list[tuple[Any, int | None, int | None]]:
    """The ECUs of a profile file: one for a plain profile; one per entry of ``ecus`` (a list of
    tables, each a profile of its own with its own ``request_id``) for a network of ECUs on one bus.

    Raises ``UserInputError`` ``SIMULATOR_PROFILE_INVALID`` naming the file and the key.
    """
    if path is None:
        return [load_profile(None)]
    document = read_profile_document(path)
    if "ecus" not in document:
        return [_profile_from(path, document)]
    entries = document["ecus"]
    if set(document) != {"ecus"}:
        raise _invalid(path, "with `ecus`, every key belongs to one of the ECUs (found "
                             f"{', '.join(sorted(set(document) - {'ecus'}))} at the top).")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise _invalid(path, "`ecus` must be a non-empty list of tables ([[ecus]] in TOML).")
    ecus = []
    for index, entry in enumerate(entries):
        try:
            ecus.append(_profile_from(path, entry, f"ecus[{index}]."))
        except UserInputError as exc:  # name the entry
            raise _invalid(path, f"ecus[{index}]: {exc.message.removeprefix(f'Profile {path}: ')}", exc.hint) from None
    ids = [ecu[1] for ecu in ecus]
    if None in ids:
        raise _invalid(path, f"ecus[{ids.index(None)}] has no request_id: each ECU of a network needs its own.")
    if len(set(ids)) != len(ids):
        raise _invalid(path, "two ECUs share a request_id.")
    return ecus


def _profile_from(path: str, document: dict[str, Any], where: str = "") -> tuple[Any, int | None, int | None]:
    """One profile document (the file, or one entry of ``ecus``) as ``(profile, request_id, response_id)``."""
    from dataclasses import replace

    from canarchy.simulator import EcuProfile

    profile = EcuProfile()
    unknown = sorted(set(document) - set(PROFILE_KEYS))
    if unknown:
        raise _invalid(path, f"unknown key(s) {where}{(', ' + where).join(unknown)}; "
                             f"expected {', '.join(PROFILE_KEYS)} (or `ecus`, a list of ECUs).")
    changes: dict[str, Any] = {}
    request_id = response_id = None
    if "request_id" in document:
        request_id = _int(path, "request_id", document["request_id"], 0, 0x1FFFFFFF)
    if "response_id" in document:
        response_id = _int(path, "response_id", document["response_id"], 0, 0x1FFFFFFF)
    if "services" in document:
        changes["supported_sids"] = _sid_list(path, "services", document["services"], 0x00, 0xFF)
        if NEGATIVE_RESPONSE_SID in changes["supported_sids"]:
            raise _invalid(path, "services lists 0x7F, the negative response SID (ISO 14229-1).")
    if "nrc" in document:
        changes["forced_nrcs"] = {_int(path, f"nrc key {sid!r}", sid, 0, 0xFF): _int(path, f"nrc.{sid}", nrc, 1, 0xFF)
                                  for sid, nrc in _table(path, document, "nrc").items()}
    if "dids" in document:
        changes["dids"] = _dids(path, _table(path, document, "dids"))
    if "writable_dids" in document:
        changes["writable_dids"] = _sid_list(path, "writable_dids", document["writable_dids"], 0, 0xFFFF)
    if "security" in document:
        changes.update(_security(path, _table(path, document, "security")))
    for key, field_name in (("pending", "pending"), ("delays", "response_delays")):
        if key in document:
            changes[field_name] = {_int(path, f"{key} key {sid!r}", sid, 0, 0xFF): _seconds(path, f"{key}.{sid}", s)
                                   for sid, s in _table(path, document, key).items()}
    if "padding" in document:
        padding = document["padding"]
        changes["padding"] = None if padding is False else _int(path, "padding", padding, 0, 0xFF)
    if "silent" in document:
        if not isinstance(document["silent"], bool):
            raise _invalid(path, f"{where}silent must be true or false, got {document['silent']!r}.")
        changes["silent"] = document["silent"]
    return replace(profile, **changes), request_id, response_id


def _dids(path: str, table: dict[str, Any]) -> dict[int, bytes]:
    """The ``dids`` table: DID -> its value, a text string (UTF-8) or ``{hex = ".."}``, 1..4000 bytes."""
    dids = {}
    for did, value in table.items():
        number = _int(path, f"dids key {did!r}", did, 0, 0xFFFF)
        if isinstance(value, str):
            data = value.encode("utf-8")
        elif isinstance(value, dict) and set(value) == {"hex"}:
            data = _hex(path, f"dids.{did}.hex", value["hex"], 4000)
        else:
            raise _invalid(path, f"dids.{did} must be a text string or {{hex = \"..\"}}, got {value!r}.")
        if not data or len(data) > 4000:
            raise _invalid(path, f"dids.{did} must hold 1..4000 bytes (one ISO-TP message), has {len(data)}.")
        dids[number] = data
    return dids


def _security(path: str, security: dict[str, Any]) -> dict[str, Any]:
    """The ``security`` table as the profile's ``security_*`` field changes."""
    unknown = sorted(set(security) - set(_SECURITY_KEYS))
    if unknown:
        raise _invalid(path, f"unknown key(s) security.{', security.'.join(unknown)}; "
                             f"expected {', '.join(_SECURITY_KEYS)}.")
    changes: dict[str, Any] = {}
    if "seed" in security:
        changes["security_seed"] = _hex(path, "security.seed", security["seed"], 32)
    if "key" in security:
        changes["security_key"] = _hex(path, "security.key", security["key"], 32)
    if "max_attempts" in security:
        changes["security_max_attempts"] = _int(path, "security.max_attempts", security["max_attempts"], 1, 255)
    if "lockout" in security:
        changes["security_lockout"] = _seconds(path, "security.lockout", security["lockout"])
    return changes


def describe_profile(profile: Any) -> dict[str, Any]:
    """The profile as JSON: hex strings for SIDs, NRCs and DIDs, DID values as hex and (when printable) text."""
    def text(value: bytes) -> str | None:
        try:
            decoded = value.decode("ascii")
        except UnicodeDecodeError:
            return None
        return decoded if decoded.isprintable() else None

    return {
        "silent": profile.silent,
        "services": [f"0x{sid:02X}" for sid in sorted(profile.supported_sids)],
        "nrc": {f"0x{sid:02X}": f"0x{nrc:02X}" for sid, nrc in sorted(profile.forced_nrcs.items())},
        "dids": {f"0x{did:04X}": {"hex": value.hex(), "text": text(value)}
                 for did, value in sorted(profile.dids.items())},
        "writable_dids": [f"0x{did:04X}" for did in sorted(profile.writable_dids)],
        "security": {"seed": profile.security_seed.hex(), "key": profile.security_key.hex(),
                     "max_attempts": profile.security_max_attempts, "lockout": profile.security_lockout},
        "pending": {f"0x{sid:02X}": s for sid, s in sorted(profile.pending.items())},
        "delays": {f"0x{sid:02X}": s for sid, s in sorted(profile.response_delays.items())},
        "padding": profile.padding,
    }
