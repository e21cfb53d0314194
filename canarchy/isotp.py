"""ISO 15765-2 (ISO-TP) reassembly from a recorded frame stream (passive: nothing is sent).

Protocol control information (PCI), the high nibble of the first data byte
(ISO 15765-2:2016, §9.6, normal addressing)::

    0  single frame (SF)        byte 0 low nibble = length 1..7; CAN FD: 0 and byte 1 = length 8..62
    1  first frame (FF)         12-bit length in byte 0 low nibble + byte 1 (8..4095);
                                0x000 escapes to a 32-bit length in bytes 2..5
    2  consecutive frame (CF)   byte 0 low nibble = sequence number, 1, 2 .. 15, 0, 1 ..
    3  flow control (FC)        sent by the receiver; ignored for reassembly

The payload length comes from the SF/FF header, so padding after it (0x00,
0x55, 0xAA, 0xCC ... whatever the ECU fills with) is stripped. A consecutive
frame with the wrong sequence number aborts the message being received (as a
receiving ECU does); the PDU is dropped with a warning.

Public surface: :class:`IsoTpPdu`, :class:`IsoTpReassembler` (one arbitration
ID), :func:`reassemble` (several IDs over one frame stream). No python-can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from canarchy.transport import CanFrame

PCI_SINGLE = 0
PCI_FIRST = 1
PCI_CONSECUTIVE = 2
PCI_FLOW_CONTROL = 3


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
    appended to ``warnings`` as strings naming the ID and the frame's
    timestamp; the caller drains them. ``flow_control_count`` counts FC frames
    seen on this ID.
    """

    def __init__(self, arbitration_id: int) -> None:
        self.arbitration_id = arbitration_id
        self.warnings: list[str] = []
        self.flow_control_count = 0
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
            return self._single(frame, data)
        if pci == PCI_FIRST:
            self._first(frame, data)
            return None
        if pci == PCI_CONSECUTIVE:
            return self._consecutive(frame, data)
        if pci == PCI_FLOW_CONTROL:
            self.flow_control_count += 1
            return None
        self._warn(frame, f"invalid PCI type {pci} (byte 0x{data[0]:02X})")
        return None

    @property
    def pending(self) -> bool:
        """True while a multi-frame message is incomplete."""
        return self._active

    def finish(self) -> None:
        """End of the stream: warn about a message left incomplete."""
        if self._active:
            self.warnings.append(
                f"ISO-TP 0x{self.arbitration_id:X}: message from t={self._first_timestamp:.6f} incomplete at end of "
                f"capture ({len(self._buffer)} of {self._expected_length} bytes)")
            self._active = False

    # -- internals ---------------------------------------------------------------------------

    def _warn(self, frame: CanFrame, text: str) -> None:
        self.warnings.append(f"ISO-TP 0x{self.arbitration_id:X} t={frame.timestamp:.6f}: {text}")

    def _interrupt(self, frame: CanFrame, by: str) -> None:
        if self._active:
            self._warn(frame, f"{by} interrupts the message begun at t={self._first_timestamp:.6f} "
                              f"({len(self._buffer)} of {self._expected_length} bytes); it is dropped")
            self._active = False

    def _single(self, frame: CanFrame, data: bytes) -> IsoTpPdu | None:
        length = data[0] & 0x0F
        start = 1
        if length == 0 and len(data) > 8:  # CAN FD escape: the length is in byte 1
            length, start = data[1], 2
        if length == 0 or start + length > len(data):
            self._warn(frame, f"single frame declares {length} byte(s) but carries {len(data) - start}")
            return None
        self._interrupt(frame, "a single frame")
        return IsoTpPdu(self.arbitration_id, bytes(data[start:start + length]), frame.timestamp, frame.timestamp, 1)

    def _first(self, frame: CanFrame, data: bytes) -> None:
        if len(data) < 2:
            self._warn(frame, "first frame shorter than its 2-byte header")
            return
        length = ((data[0] & 0x0F) << 8) | data[1]
        start = 2
        if length == 0:  # escape: 32-bit length
            if len(data) < 6:
                self._warn(frame, "first frame with a 32-bit length but fewer than 6 bytes")
                return
            length, start = int.from_bytes(data[2:6], "big"), 6
        self._interrupt(frame, "a first frame")
        if length <= len(data) - start:
            self._warn(frame, f"first frame declares {length} byte(s), which would fit a single frame; ignored")
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
            self._warn(frame, f"consecutive frame (SN {sequence}) without a first frame; ignored")
            return None
        if sequence != self._next_sequence:
            self._warn(frame, f"sequence error: expected SN {self._next_sequence}, got {sequence}; "
                              f"the message begun at t={self._first_timestamp:.6f} is dropped")
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
               warnings: list[str] | None = None) -> Iterator[IsoTpPdu]:
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
