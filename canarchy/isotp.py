"""ISO 15765-2 (ISO-TP): frame forms, reassembly of a recorded frame stream, and a tester.

PCI and lengths as in ISO 15765-2:2016, §9.6 (normal addressing); the length comes from the SF/FF header, so
padding is stripped. :func:`reassemble` and :class:`IsoTpReassembler` (passive) report trouble as
``ISOTP_*`` warning records (codes and rules: ``docs/decoding.md``); :class:`IsoTpTester` sends a request and
reassembles a segmented answer, sending flow control (the active side). No python-can.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol
from collections.abc import Callable, Iterable, Iterator

from canarchy.frames import MAX_STANDARD_ID, CanFrame
from canarchy.warning_log import WarningRecord

PCI_SINGLE = 0
PCI_FIRST = 1
PCI_CONSECUTIVE = 2
PCI_FLOW_CONTROL = 3
FLOW_STATUS_CONTINUE = 0  # ContinueToSend
FLOW_STATUS_WAIT = 1
FLOW_STATUS_OVERFLOW = 2
CLASSIC_FRAME = 8   # data bytes of a classic CAN frame
SF_MAX = 7          # payload of a classic single frame
FF_DATA = 6         # payload bytes a classic first frame carries
CF_DATA = 7         # payload bytes a consecutive frame carries
FF_MAX_LENGTH = 0xFFF  # the 12-bit first-frame length (longer needs the 32-bit escape)
#: How many FC.WAIT a sender accepts in a row before it gives up (N_WFTmax; ISO 15765-2 leaves it to the system).
MAX_WAIT_FRAMES = 10


NORMAL_FIXED_PHYSICAL = 0x18DA0000  # ISO 15765-2 normal fixed addressing, priority 6, PF 0xDA: 0x18DA<TA><SA>


def normal_fixed_id(target: int, source: int) -> int:
    """The 29-bit physical request ID from ``source`` to ``target`` (ISO 15765-2 normal fixed addressing)."""
    return NORMAL_FIXED_PHYSICAL | (target & 0xFF) << 8 | source & 0xFF


def default_response_id(request_id: int) -> int | None:
    """The usual response ID of a physical request ID, or None when there is none.

    11-bit: request + 8 (ISO 15765-4: 0x7E0 -> 0x7E8); 29-bit normal fixed
    addressing 0x18DA<TA><SA>: target and source swapped, 0x18DA<SA><TA>.
    """
    if request_id + 8 <= MAX_STANDARD_ID:
        return request_id + 8
    if request_id > MAX_STANDARD_ID and request_id & 0x1FFF0000 == NORMAL_FIXED_PHYSICAL:
        return normal_fixed_id(request_id & 0xFF, request_id >> 8 & 0xFF)
    return None


def st_min_seconds(value: int) -> float:
    """STmin byte -> seconds: 0x00-0x7F milliseconds, 0xF1-0xF9 100-900 microseconds;
    reserved values are read as 0x7F (127 ms), as ISO 15765-2 asks of a sender."""
    if value <= 0x7F:
        return value / 1000.0
    if 0xF1 <= value <= 0xF9:
        return (value - 0xF0) / 10000.0
    return 0x7F / 1000.0


def _pad(data: bytes, padding: int | None) -> bytes:
    if padding is None or len(data) >= CLASSIC_FRAME:
        return data
    return data + bytes((padding,)) * (CLASSIC_FRAME - len(data))


def single_frame(payload: bytes, padding: int | None = 0x00) -> bytes:
    """A classic single frame: ``[length, payload...]`` padded to 8 bytes (``padding`` None: unpadded).
    Raises ValueError for a payload of 0 or more than 7 bytes."""
    if not 1 <= len(payload) <= SF_MAX:
        raise ValueError(f"a single frame carries 1..{SF_MAX} bytes, not {len(payload)}")
    return _pad(bytes((len(payload),)) + payload, padding)


def flow_control(status: int = FLOW_STATUS_CONTINUE, block_size: int = 0, st_min: int = 0,
                 padding: int | None = 0x00) -> bytes:
    """A flow control frame ``3<FS> BS STmin`` (padded to 8 bytes unless ``padding`` is None)."""
    return _pad(bytes((PCI_FLOW_CONTROL << 4 | status, block_size, st_min)), padding)


def segment(payload: bytes, padding: int | None = 0x00) -> tuple[bytes, list[bytes]]:
    """A payload of 8..4095 bytes as a first frame and its consecutive frames
    (sequence numbers 1..15, 0, 1 ...; the last one padded). Raises ValueError otherwise."""
    if not SF_MAX < len(payload) <= FF_MAX_LENGTH:
        raise ValueError(f"a segmented message carries {SF_MAX + 1}..{FF_MAX_LENGTH} bytes, not {len(payload)}")
    first = bytes((PCI_FIRST << 4 | len(payload) >> 8, len(payload) & 0xFF)) + payload[:FF_DATA]
    rest = []
    for index, offset in enumerate(range(FF_DATA, len(payload), CF_DATA)):
        pci = PCI_CONSECUTIVE << 4 | (index + 1) & 0x0F
        rest.append(_pad(bytes((pci,)) + payload[offset:offset + CF_DATA], padding))
    return first, rest


def single_frame_payload(data: bytes) -> bytes | None:
    """The payload of a valid single frame (classic, or the CAN FD escape with the
    length in byte 1), or None for anything else."""
    if not data or data[0] >> 4 != PCI_SINGLE:
        return None
    length, start = data[0] & 0x0F, 1
    if length == 0 and len(data) > CLASSIC_FRAME:
        length, start = data[1], 2
    if length == 0 or start + length > len(data):
        return None
    return bytes(data[start:start + length])


@dataclass(frozen=True)
class IsoTpPdu:
    """One reassembled ISO-TP message.

    ``arbitration_id``: the ID it was carried on; ``data``: the payload
    (exactly ``length`` bytes, padding stripped); ``timestamp``: of its first
    frame (s since the epoch); ``end_timestamp``: of its last frame;
    ``frame_count``: CAN frames it took (1 for a single frame);
    ``length_byte``: the low byte of the length as it stood in the SF/FF
    header (some DBCs, e.g. CSS Electronics' TP DBCs, put it before the data).
    """

    arbitration_id: int
    data: bytes
    timestamp: float
    end_timestamp: float
    frame_count: int

    @property
    def length(self) -> int:
        """Payload length in bytes."""
        return len(self.data)

    @property
    def length_byte(self) -> int:
        """The length's low byte, as the header carried it."""
        return len(self.data) & 0xFF

    @property
    def multi_frame(self) -> bool:
        """True when it took a first frame and consecutive frames."""
        return self.frame_count > 1


class IsoTpReassembler:
    """Reassemble the ISO-TP messages of one arbitration ID.

    Feed frames in capture order with :meth:`feed`; it returns a finished
    :class:`IsoTpPdu` or None. Problems (an unexpected CF, a wrong sequence
    number, an FF that interrupts another message, an invalid PCI) are
    appended to ``warnings`` as :class:`~canarchy.warning_log.WarningRecord`
    strings naming the ID and the frame's timestamp (details: ``arbitration_id``,
    ``timestamp``; sequence errors add ``expected_sequence`` and ``sequence``);
    the caller drains them. Counts: ``complete_count`` (PDUs returned),
    ``dropped_count`` (multi-frame messages aborted by a sequence error or
    interrupted), ``incomplete_count`` (open at :meth:`finish`),
    ``flow_control_count`` (FC frames seen on this ID).
    """

    def __init__(self, arbitration_id: int) -> None:
        self.arbitration_id = arbitration_id
        self.warnings: list[WarningRecord] = []
        self.flow_control_count = 0
        self.complete_count = 0
        self.dropped_count = 0
        self.incomplete_count = 0
        self._buffer = bytearray()
        self._expected_length = 0
        self._next_sequence = 0
        self._first_timestamp = 0.0
        self._frames = 0
        self._active = False

    def feed(self, frame: CanFrame) -> IsoTpPdu | None:
        """Take one frame carried on this ID; return the PDU it completes, if any."""
        data = frame.data
        if not data or frame.is_remote_frame:
            return None
        pci = data[0] >> 4
        if pci == PCI_SINGLE:
            pdu = self._single(frame, data)
        elif pci == PCI_FIRST:
            self._first(frame, data)
            return None
        elif pci == PCI_CONSECUTIVE:
            pdu = self._consecutive(frame, data)
        elif pci == PCI_FLOW_CONTROL:
            self.flow_control_count += 1
            return None
        else:
            self._warn(frame, "ISOTP_INVALID_PCI", f"invalid PCI type {pci} (byte 0x{data[0]:02X})")
            return None
        if pdu is not None:
            self.complete_count += 1
        return pdu

    @property
    def pending(self) -> bool:
        """True while a multi-frame message is incomplete."""
        return self._active

    def finish(self) -> None:
        """End of the stream: warn about a message left incomplete."""
        if self._active:
            self.incomplete_count += 1
            self.warnings.append(WarningRecord(
                "ISOTP_INCOMPLETE",
                f"ISO-TP 0x{self.arbitration_id:X}: message from t={self._first_timestamp:.6f} incomplete at end of "
                f"capture ({len(self._buffer)} of {self._expected_length} bytes)",
                arbitration_id=self.arbitration_id, timestamp=self._first_timestamp,
                received_bytes=len(self._buffer), expected_bytes=self._expected_length))
            self._active = False

    # -- internals ---------------------------------------------------------------------------

    def _warn(self, frame: CanFrame, code: str, text: str, **details: object) -> None:
        self.warnings.append(WarningRecord(code, f"ISO-TP 0x{self.arbitration_id:X} t={frame.timestamp:.6f}: {text}",
                                           arbitration_id=self.arbitration_id, timestamp=frame.timestamp, **details))

    def _interrupt(self, frame: CanFrame, by: str) -> None:
        if self._active:
            self.dropped_count += 1
            self._warn(frame, "ISOTP_INTERRUPTED",
                       f"{by} interrupts the message begun at t={self._first_timestamp:.6f} "
                       f"({len(self._buffer)} of {self._expected_length} bytes); it is dropped",
                       first_timestamp=self._first_timestamp, received_bytes=len(self._buffer),
                       expected_bytes=self._expected_length)
            self._active = False

    def _single(self, frame: CanFrame, data: bytes) -> IsoTpPdu | None:
        payload = single_frame_payload(data)
        if payload is None:
            length, start = (data[1], 2) if data[0] & 0x0F == 0 and len(data) > CLASSIC_FRAME else (data[0] & 0x0F, 1)
            self._warn(frame, "ISOTP_SF_LENGTH_INVALID",
                       f"single frame declares {length} byte(s) but carries {len(data) - start}")
            return None
        self._interrupt(frame, "a single frame")
        return IsoTpPdu(self.arbitration_id, payload, frame.timestamp, frame.timestamp, 1)

    def _first(self, frame: CanFrame, data: bytes) -> None:
        if len(data) < 2:
            self._warn(frame, "ISOTP_FF_INVALID", "first frame shorter than its 2-byte header")
            return
        length = ((data[0] & 0x0F) << 8) | data[1]
        start = 2
        if length == 0:  # escape: 32-bit length
            if len(data) < 6:
                self._warn(frame, "ISOTP_FF_INVALID", "first frame with a 32-bit length but fewer than 6 bytes")
                return
            length, start = int.from_bytes(data[2:6], "big"), 6
        self._interrupt(frame, "a first frame")
        if length <= len(data) - start:
            self._warn(frame, "ISOTP_FF_INVALID",
                       f"first frame declares {length} byte(s), which would fit a single frame; ignored")
            return
        self._buffer = bytearray(data[start:])
        self._expected_length = length
        self._next_sequence = 1
        self._first_timestamp = frame.timestamp
        self._frames = 1
        self._active = True

    def _consecutive(self, frame: CanFrame, data: bytes) -> IsoTpPdu | None:
        sequence = data[0] & 0x0F
        if not self._active:
            self._warn(frame, "ISOTP_CF_UNEXPECTED",
                       f"consecutive frame (SN {sequence}) without a first frame; ignored", sequence=sequence)
            return None
        if sequence != self._next_sequence:
            self.dropped_count += 1
            self._warn(frame, "ISOTP_SEQUENCE_ERROR", f"sequence error: expected SN {self._next_sequence}, got "
                       f"{sequence}; the message begun at t={self._first_timestamp:.6f} is dropped",
                       expected_sequence=self._next_sequence, sequence=sequence, first_timestamp=self._first_timestamp,
                       received_bytes=len(self._buffer), expected_bytes=self._expected_length)
            self._active = False
            return None
        self._next_sequence = (sequence + 1) & 0x0F
        self._frames += 1
        self._buffer += data[1:]
        if len(self._buffer) < self._expected_length:
            return None
        self._active = False
        return IsoTpPdu(self.arbitration_id, bytes(self._buffer[:self._expected_length]), self._first_timestamp,
                        frame.timestamp, self._frames)


def reassemble(frames: Iterable[CanFrame], arbitration_ids: Iterable[int],
               warnings: list[WarningRecord] | None = None) -> Iterator[IsoTpPdu]:
    """Yield the ISO-TP PDUs carried on ``arbitration_ids`` in ``frames``, in completion order.

    Frames on other IDs are skipped. Reassembly warnings are appended to
    ``warnings`` when a list is given (see :class:`IsoTpReassembler`).
    Streaming: holds at most one partial message per ID.
    """
    machines = {can_id: IsoTpReassembler(can_id) for can_id in arbitration_ids}
    for frame in frames:
        machine = machines.get(frame.arbitration_id)
        if machine is None:
            continue
        pdu = machine.feed(frame)
        if warnings is not None and machine.warnings:
            warnings.extend(machine.warnings)
        machine.warnings.clear()
        if pdu is not None:
            yield pdu
    for machine in machines.values():
        machine.finish()
        if warnings is not None:
            warnings.extend(machine.warnings)


# -- the tester (active side) -------------------------------------------------------------------


class BusLink(Protocol):
    """A bus opened for a whole session (``canarchy.transport.Backend.session``):
    ``send(frame)`` returns the send time (s since the epoch); ``recv(timeout)``
    returns the next frame seen on the bus within ``timeout`` seconds, or None."""

    def send(self, frame: CanFrame) -> float: ...

    def recv(self, timeout: float) -> CanFrame | None: ...


@dataclass
class Exchange:
    """One request and what came back on the response ID.

    ``request``: the message sent; ``sent_at``: when its first frame went out;
    ``frames``: every frame sent or received for it, in order, as
    ``(direction "tx"/"rx", frame)``; ``messages``: the reassembled answers in
    order (a 0x78 responsePending included); ``first_reply_at``: time of the
    first frame received on the response ID (None: silence); ``warnings``:
    ISO-TP problems (an aborted answer, an ECU that refused a segmented request).
    """

    request: bytes
    sent_at: float = 0.0
    frames: list[tuple[str, CanFrame]] = field(default_factory=list)
    messages: list[bytes] = field(default_factory=list)
    first_reply_at: float | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def latency(self) -> float | None:
        """Seconds from the request to the first frame of the answer (None: silence)."""
        return None if self.first_reply_at is None else max(0.0, self.first_reply_at - self.sent_at)


class IsoTpTester:
    """The tester side of ISO 15765-2 (normal or normal-fixed addressing, classic CAN).

    ``link``: a :class:`BusLink`; ``request_id`` / ``response_id``: physical
    IDs (29-bit when > 0x7FF); ``padding``: byte frames are padded with (None:
    unpadded); ``block_size`` / ``st_min``: what this tester's flow control
    asks of the ECU; ``n_timeout``: seconds to wait for the ECU's flow control
    (N_Bs) or its next consecutive frame (N_Cr), 1 s as ISO 15765-2 gives.
    """

    def __init__(self, link: BusLink, request_id: int, response_id: int, *, padding: int | None = 0x00,
                 block_size: int = 0, st_min: int = 0, n_timeout: float = 1.0) -> None:
        self.link = link
        self.request_id = request_id
        self.response_id = response_id
        self.padding = padding
        self.block_size = block_size
        self.st_min = st_min
        self.n_timeout = n_timeout
        self._request_extended = request_id > MAX_STANDARD_ID
        self._response_extended = response_id > MAX_STANDARD_ID

    def _ours(self, frame: CanFrame) -> bool:
        return frame.arbitration_id == self.response_id and frame.is_extended_id == self._response_extended

    def _send(self, exchange: Exchange, data: bytes) -> float:
        frame = CanFrame(self.request_id, data, is_extended_id=self._request_extended, is_rx=False)  # ours: sent
        sent_at = self.link.send(frame)
        exchange.frames.append(("tx", frame))
        return sent_at

    def _recv_ours(self, exchange: Exchange, deadline: float,
                   other: Callable[[CanFrame], None] | None) -> CanFrame | None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            frame = self.link.recv(remaining)
            if frame is None:
                return None
            if self._ours(frame):
                exchange.frames.append(("rx", frame))
                if exchange.first_reply_at is None:
                    exchange.first_reply_at = frame.timestamp
                return frame
            if other is not None:
                other(frame)

    def request(self, message: bytes, timeout: float, *, settle: Callable[[bytes], bool] | None = None,
                pending_timeout: float | None = None,
                other: Callable[[CanFrame], None] | None = None) -> Exchange:
        """Send ``message`` and collect the answer.

        Waits ``timeout`` seconds for the first frame of an answer; a first
        frame is answered with flow control and its consecutive frames are
        reassembled (each within ``n_timeout``). An answer for which
        ``settle(message)`` is true (e.g. UDS 0x78 responsePending) restarts
        the wait with ``pending_timeout`` (default ``timeout``); any other
        ends the exchange. Frames on other IDs go to ``other`` (when given).
        """
        exchange = Exchange(bytes(message))
        if len(message) <= SF_MAX:
            exchange.sent_at = self._send(exchange, single_frame(message, self.padding))
        elif not self._send_segmented(exchange, message, other):
            return exchange
        reassembler = IsoTpReassembler(self.response_id)
        deadline = time.monotonic() + timeout
        in_block = 0
        while True:
            frame = self._recv_ours(exchange, deadline, other)
            if frame is None:
                if reassembler.pending:
                    exchange.warnings.append(f"ISO-TP 0x{self.response_id:X}: the answer stopped before its end "
                                             f"(no consecutive frame within {self.n_timeout:g} s, N_Cr)")
                return exchange
            pdu = reassembler.feed(frame)
            exchange.warnings += reassembler.warnings
            reassembler.warnings.clear()
            kind = frame.data[0] >> 4 if frame.data else None
            if kind == PCI_FIRST and reassembler.pending:
                self._send(exchange, flow_control(FLOW_STATUS_CONTINUE, self.block_size, self.st_min, self.padding))
                in_block = 0
                deadline = time.monotonic() + self.n_timeout
            elif kind == PCI_CONSECUTIVE and reassembler.pending:
                in_block += 1
                if self.block_size and in_block >= self.block_size:
                    self._send(exchange, flow_control(FLOW_STATUS_CONTINUE, self.block_size, self.st_min,
                                                      self.padding))
                    in_block = 0
                deadline = time.monotonic() + self.n_timeout
            if pdu is None:
                continue
            exchange.messages.append(pdu.data)
            if settle is not None and settle(pdu.data):
                deadline = time.monotonic() + (timeout if pending_timeout is None else pending_timeout)
                continue
            return exchange

    def _send_segmented(self, exchange: Exchange, message: bytes,
                        other: Callable[[CanFrame], None] | None) -> bool:
        """Send a first frame and its consecutive frames as the ECU's flow control allows; False when it refused."""
        first, rest = segment(message, self.padding)
        exchange.sent_at = self._send(exchange, first)
        waits = 0
        last_cf = None
        while rest:
            frame = self._recv_ours(exchange, time.monotonic() + self.n_timeout, other)
            if frame is None or not frame.data or frame.data[0] >> 4 != PCI_FLOW_CONTROL or len(frame.data) < 3:
                reason = "no flow control" if frame is None else f"frame {frame.data.hex()} instead of flow control"
                exchange.warnings.append(f"ISO-TP 0x{self.request_id:X}: segmented request abandoned: {reason}")
                return False
            status = frame.data[0] & 0x0F
            if status == FLOW_STATUS_WAIT and waits < MAX_WAIT_FRAMES:
                waits += 1
                continue
            if status != FLOW_STATUS_CONTINUE:
                overflow = ", overflow" if status == FLOW_STATUS_OVERFLOW else ""
                exchange.warnings.append(f"ISO-TP 0x{self.request_id:X}: segmented request refused "
                                         f"(flow status {status}{overflow})")
                return False
            waits = 0
            block, gap = frame.data[1], st_min_seconds(frame.data[2])
            for _ in range(len(rest) if block == 0 else min(block, len(rest))):
                if last_cf is not None and (wait := last_cf + gap - time.monotonic()) > 0:
                    time.sleep(wait)  # STmin: between any two consecutive frames, across blocks too
                self._send(exchange, rest.pop(0))
                last_cf = time.monotonic()
        return True
