"""What a response-feedback campaign learns from the replies, and what it sends next.

Each reply frame becomes a marker (``nrc:27:35``, ``positive:67``, ``silence``, ``timing:slow``); an input is
new when a marker's response class is new for its request shape. Inputs are the corpus entries, then
structure-aware mutations of entries drawn by weight from one seeded ``random.Random``. UDS and ISO-TP terms:
ISO 14229-1, ISO 15765-2; the markers' meaning: ``docs/fuzz-guided.md``.
"""

from __future__ import annotations

import random

from canarchy.frames import CanFrame
from canarchy.isotp import PCI_CONSECUTIVE, PCI_FIRST, PCI_FLOW_CONTROL, single_frame_payload
from canarchy.uds import NEGATIVE_RESPONSE_SID, NRC_RESPONSE_PENDING, POSITIVE_RESPONSE_OFFSET

MAX_CLASSIC_DATA = 8
MARKER_SILENCE = "silence"
MARKER_SLOW = "timing:slow"
_INTERESTING = (0x00, 0x01, 0x02, 0x03, 0x7F, 0x80, 0xFE, 0xFF)
_OPERATORS = ("bitflip", "random_byte", "arith", "interesting", "insert", "append", "delete", "truncate")
_RAW_MUTATION_CHANCE = 0.125
_SID_MUTATION_CHANCE = 0.1
_HIGH_WEIGHT = 4


# -- markers --

def isotp_payload(data: bytes) -> bytes | None:
    """The UDS bytes of an ISO-TP single frame, or the first bytes of a first frame; None otherwise."""
    payload = single_frame_payload(data)
    if payload is None and data and data[0] >> 4 == PCI_FIRST and len(data) > 2:
        return bytes(data[2:])
    return payload


def reply_marker(data: bytes) -> str:
    """The marker of one reply frame's data (see the module docstring)."""
    if data and data[0] >> 4 == PCI_FLOW_CONTROL:
        return f"isotp:fc:{data[0]:02X}"
    if data and data[0] >> 4 == PCI_CONSECUTIVE:
        return "isotp:cf"
    payload = isotp_payload(data)
    if not payload:
        return "isotp:invalid"
    if payload[0] == NEGATIVE_RESPONSE_SID and len(payload) >= 3:
        return f"nrc:{payload[1]:02X}:{payload[2]:02X}"
    if payload[0] >= POSITIVE_RESPONSE_OFFSET:
        return f"positive:{payload[0]:02X}"
    return f"other:{payload[0]:02X}"


def is_response_pending(frame: CanFrame) -> bool:
    """True for a UDS ``7F SID 78`` (requestCorrectlyReceived-ResponsePending, ISO 14229-1)."""
    payload = isotp_payload(frame.data)
    return (bool(payload) and len(payload) >= 3 and payload[0] == NEGATIVE_RESPONSE_SID
            and payload[2] == NRC_RESPONSE_PENDING)


def markers_for(replies: list[CanFrame], latency: float | None, slow_threshold: float) -> list[str]:
    """Sorted distinct markers of one iteration: each reply's, ``silence``, ``timing:slow``."""
    if not replies:
        return [MARKER_SILENCE]
    markers = {reply_marker(frame.data) for frame in replies}
    if latency is not None and latency > slow_threshold:
        markers.add(MARKER_SLOW)
    return sorted(markers)


# -- novelty: request shapes and response classes --

SHAPE_RAW = "raw"
SHAPE_OTHER_SID = "sid:*"


def seeded_sids(entries: list[bytes]) -> frozenset[int]:
    """The SIDs of the initial corpus entries that are valid ISO-TP single frames: the services under test."""
    return frozenset(split[0][0] for entry in entries if (split := split_single_frame(entry)) is not None)


def request_shape(payload: bytes, seeded: frozenset[int]) -> str:
    """The request shape of an input: ``sid:XX`` for a valid single frame whose SID is a service
    under test (:func:`seeded_sids`), ``sid:*`` for one with any other SID, ``raw`` for a frame
    that is not a valid single frame (a mutated PCI)."""
    split = split_single_frame(payload)
    if split is None:
        return SHAPE_RAW
    sid = split[0][0]
    return f"sid:{sid:02X}" if sid in seeded else SHAPE_OTHER_SID


def response_class(marker: str) -> str:
    """The response class of a marker: the NRC without the SID it repeats (``nrc:27:35`` -> ``nrc:35``);
    every other marker is its own class."""
    if marker.startswith("nrc:") and marker.count(":") == 2:
        return "nrc:" + marker.rsplit(":", 1)[1]
    return marker


def novelty_keys(shape: str, markers: list[str]) -> dict[str, str]:
    """``{key: marker}``: the novelty key ``"<shape> <class>"`` of each marker (the first marker of a class)."""
    keys: dict[str, str] = {}
    for marker in markers:
        keys.setdefault(f"{shape} {response_class(marker)}", marker)
    return keys


# -- input generation --

def split_single_frame(data: bytes) -> tuple[bytes, bytes] | None:
    if not data or data[0] >> 4 != 0:
        return None
    length = data[0] & 0x0F
    if not 1 <= length <= min(7, len(data) - 1):
        return None
    return data[1:1 + length], data[1 + length:]


class Mutator:
    """Structure-aware byte mutations driven by one ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def mutate(self, parent: bytes) -> tuple[bytes, list[str]]:
        """Return ``(child, operator names)``; the child is 1-8 bytes."""
        split = split_single_frame(parent)
        if split is not None and self.rng.random() >= _RAW_MUTATION_CHANCE:
            body, padding = split
            body, ops = self._mutate_bytes(body, max_len=7, keep_first=True)
            child = bytes((len(body),)) + body
            if padding and len(child) < len(parent):
                child += bytes((padding[0],)) * (len(parent) - len(child))
            return child, ops
        child, ops = self._mutate_bytes(parent, max_len=MAX_CLASSIC_DATA)
        return child, ["raw"] + ops

    def _position(self, length: int, keep_first: bool) -> int:
        # In a UDS body byte 0 is the SID: mostly leave it alone, so the
        # campaign explores the service it was seeded with.
        if keep_first and length > 1 and self.rng.random() >= _SID_MUTATION_CHANCE:
            return self.rng.randrange(1, length)
        return self.rng.randrange(length)

    def _mutate_bytes(self, data: bytes, max_len: int, keep_first: bool = False) -> tuple[bytes, list[str]]:
        rng = self.rng
        buf = bytearray(data)
        ops: list[str] = []
        for _ in range(2 if rng.random() < 0.3 else 1):
            op = rng.choice(_OPERATORS)
            if op in ("bitflip", "random_byte", "arith", "interesting") and buf:
                pos = self._position(len(buf), keep_first)
                if op == "bitflip":
                    buf[pos] ^= 1 << rng.randrange(8)
                elif op == "random_byte":
                    buf[pos] = rng.randrange(256)
                elif op == "arith":
                    buf[pos] = (buf[pos] + rng.choice((-4, -3, -2, -1, 1, 2, 3, 4))) & 0xFF
                else:
                    buf[pos] = rng.choice(_INTERESTING)
            elif op == "insert" and len(buf) < max_len:
                buf.insert(rng.randrange(len(buf) + 1), rng.randrange(256))
            elif op == "append" and len(buf) < max_len:
                buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, max_len - len(buf))))
            elif op == "delete" and len(buf) > 1:
                del buf[self._position(len(buf), keep_first)]
            elif op == "truncate" and len(buf) > 1:
                del buf[rng.randint(1, len(buf) - 1):]
            else:
                buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
                op = "bitflip"
            ops.append(op)
        return bytes(buf), ops


def marker_weight(markers: list[str]) -> int:
    """Selection weight of a corpus entry whose input produced ``markers`` (new ones).

    4 when one of them says something about the service (a positive response,
    an NRC other than 0x11 serviceNotSupported, slow timing, ISO-TP flow
    control); 1 for ``nrc:*:11``, ``silence`` and malformed replies alone, so
    a campaign does not spend itself on SIDs the target does not have.
    """
    for marker in markers:
        if marker in (MARKER_SILENCE, "isotp:invalid", "isotp:cf") or marker.startswith("other:"):
            continue
        if marker.startswith("nrc:") and marker.endswith(":11"):
            continue
        return _HIGH_WEIGHT
    return 1


class InputGenerator:
    """The corpus and the sequence of inputs drawn from it.

    The first ``len(initial)`` inputs are the initial corpus entries, unmutated
    (``parent`` None); then each input is a mutation of a corpus entry chosen
    with probability proportional to its weight (initial entries: 4; findings:
    :func:`marker_weight`). ``add()`` grows the corpus; the sequence depends
    only on ``rng_seed``, the initial corpus and the entries added.
    """

    def __init__(self, initial: list[bytes], rng_seed: int) -> None:
        self.corpus: list[bytes] = []
        self.weights: list[int] = []
        self._known: set[bytes] = set()
        for entry in initial:
            self.add(entry, _HIGH_WEIGHT)
        self._baseline = list(self.corpus)
        self.rng = random.Random(rng_seed)
        self.mutator = Mutator(self.rng)

    def add(self, entry: bytes, weight: int = 1) -> bool:
        """Add ``entry`` (selection ``weight``) to the corpus; False when it was already there."""
        if entry in self._known:
            return False
        self._known.add(entry)
        self.corpus.append(entry)
        self.weights.append(weight)
        return True

    def next(self) -> tuple[bytes, bytes | None, list[str]]:
        """Return ``(payload, parent, operators)`` for the next iteration."""
        if self._baseline:
            return self._baseline.pop(0), None, []
        parent = self.rng.choices(self.corpus, self.weights)[0]
        child, ops = self.mutator.mutate(parent)
        return child, parent, ops


def plan_payloads(seed_data: bytes, corpus: list[bytes], rng_seed: int, count: int) -> list[bytes]:
    """The first ``count`` inputs a campaign would send if no finding grew the corpus.

    A live campaign sends exactly these until its first mutated input produces
    a new marker (the baseline inputs do not change the corpus).
    """
    generator = InputGenerator([seed_data, *corpus], rng_seed)
    return [generator.next()[0] for _ in range(count)]
