"""A CAN / CAN FD frame as canarchy handles it, its filters, and its python-can form.

:class:`CanFrame` carries an arbitration ID, data, flags and timestamp, with its JSON and candump forms;
:class:`FrameFilter` is candump's ``id:mask`` filter (can-utils ``candump.c``). Limits: ISO 11898-1
(11-bit and 29-bit identifiers; the CAN FD data lengths); a frame beyond them is ``UserInputError``
``INVALID_FRAME``. python-can is imported only to build a ``can.Message``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from canarchy.errors import UserInputError

MAX_STANDARD_ID = 0x7FF
MAX_EXTENDED_ID = 0x1FFFFFFF
CAN_FD_DLCS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 48, 64)
#: The first second past the year 9999 (UTC), seconds since the Unix epoch: a frame read from a file has a
#: timestamp in [0, this), which every format canarchy writes (and Python's ``datetime``) can hold.
TIMESTAMP_LIMIT = 253402300800.0


def checked_timestamp(stamp: float) -> float:
    """``stamp`` when it is in [0, :data:`TIMESTAMP_LIMIT`) (finite, not before 1970, not past the year 9999);
    else ``UserInputError`` ``INVALID_FRAME`` (the capture readers make it a malformed line's warning)."""
    if 0.0 <= stamp < TIMESTAMP_LIMIT:  # false for NaN too
        return stamp
    raise UserInputError("INVALID_FRAME", f"timestamp {stamp!r} is outside 0 .. {TIMESTAMP_LIMIT:.0f} "
                         "(1970 to the end of the year 9999)",
                         "Fix the timestamp: seconds since the Unix epoch, at most the year 9999.")


def can_id_text(arbitration_id: int, is_extended_id: bool | None = None) -> str:
    """An arbitration ID as candump writes it: upper-case hex, 3 digits for an 11-bit
    ID, 8 for a 29-bit one (``is_extended_id`` None: 29-bit when above 0x7FF)."""
    extended = arbitration_id > MAX_STANDARD_ID if is_extended_id is None else is_extended_id
    return f"{arbitration_id:08X}" if extended else f"{arbitration_id:03X}"


@dataclass(frozen=True)
class CanFrame:
    """One CAN or CAN FD frame.

    ``arbitration_id``: 11-bit (<= 0x7FF) or 29-bit identifier; ``data``: payload
    bytes (<= 8 for classic CAN, <= 64 for CAN FD); ``is_extended_id``: 29-bit
    frame; ``timestamp``: seconds since the Unix epoch; ``channel``: where it was
    seen or sent; ``is_rx``: received (False: sent by the recorder, candump's ``T``,
    python-can's ``is_rx``); ``len8_dlc``: a Classical CAN data frame's raw DLC 9..15 (it carries 8
    bytes; Linux's ``can_frame.len8_dlc``, candump's ``_9``), 0 when the DLC is the length.
    """

    arbitration_id: int
    data: bytes = b""
    is_extended_id: bool = False
    is_fd: bool = False
    is_remote_frame: bool = False
    timestamp: float = field(default_factory=time.time)
    channel: str | None = None
    bitrate_switch: bool = False
    error_state_indicator: bool = False
    is_error_frame: bool = False
    requested_dlc: int = 0
    is_rx: bool = True
    len8_dlc: int = 0

    def __post_init__(self) -> None:
        limit = MAX_EXTENDED_ID if self.is_extended_id else MAX_STANDARD_ID
        if not 0 <= self.arbitration_id <= limit:
            kind = "29-bit" if self.is_extended_id else "11-bit"
            raise UserInputError(
                "INVALID_FRAME",
                f"Arbitration ID 0x{self.arbitration_id:X} does not fit a {kind} identifier.",
                "Use 0x000-0x7FF for standard frames or up to 0x1FFFFFFF for extended frames.",
            )
        if len(self.data) > (64 if self.is_fd else 8):
            raise UserInputError(
                "INVALID_FRAME",
                f"{len(self.data)} data bytes do not fit a {'CAN FD' if self.is_fd else 'classic CAN'} frame.",
                "Classic CAN carries at most 8 data bytes; CAN FD at most 64 (use --fd).",
            )
        if self.is_fd and len(self.data) not in CAN_FD_DLCS:
            raise UserInputError(
                "INVALID_FRAME",
                f"{len(self.data)} data bytes is not a CAN FD payload length (ISO 11898-1: {CAN_FD_DLCS}).",
                "Pad the payload to the next CAN FD length.",
            )
        self._check_flags_and_dlc()

    def _check_flags_and_dlc(self) -> None:
        """The flags and DLC fields against the frame's kind (ISO 11898-1); ``UserInputError`` ``INVALID_FRAME``."""
        if (self.bitrate_switch or self.error_state_indicator) and not self.is_fd:
            raise UserInputError("INVALID_FRAME", "Bit rate switch (BRS) and ESI are flags of CAN FD frames only.",
                                 "Send a CAN FD frame (ID##<flags><data>, or --fd) to set BRS or ESI.")
        if self.is_remote_frame and (self.is_fd or self.data):
            raise UserInputError("INVALID_FRAME", "A remote frame carries no data and CAN FD has no remote frames "
                                 "(ISO 11898-1).", "Send ID#R or ID#R<DLC> (classic CAN), without data.")
        if self.len8_dlc and not (9 <= self.len8_dlc <= 15 and len(self.data) == 8 and not self.is_fd
                                  and not self.is_remote_frame):
            raise UserInputError("INVALID_FRAME", f"Raw DLC {self.len8_dlc} is not 9..15 of a Classical CAN data "
                                 "frame of 8 bytes (ISO 11898-1).", "Give 8 data bytes and a DLC of 9..F: "
                                 "123#1122334455667788_9.")
        if not 0 <= self.requested_dlc <= 15:
            raise UserInputError("INVALID_FRAME", f"Remote frame DLC {self.requested_dlc} is outside 0..15.",
                                 "Give the requested DLC as one hex digit, e.g. 123#R8.")

    @property
    def dlc(self) -> int:
        """Data length in bytes; for a remote frame the DLC it requests; a raw DLC 9..15 (``len8_dlc``)."""
        return self.requested_dlc if self.is_remote_frame else self.len8_dlc or len(self.data)

    def to_payload(self) -> dict[str, Any]:
        """JSON form: ``{arbitration_id, data (hex), dlc, is_extended_id, is_fd, is_remote_frame,
        bitrate_switch, error_state_indicator, is_error_frame, is_rx, channel, timestamp}``."""
        return {
            "arbitration_id": self.arbitration_id,
            "data": self.data.hex(),
            "dlc": self.dlc,
            "is_extended_id": self.is_extended_id,
            "is_fd": self.is_fd,
            "is_remote_frame": self.is_remote_frame,
            "bitrate_switch": self.bitrate_switch,
            "error_state_indicator": self.error_state_indicator,
            "is_error_frame": self.is_error_frame,
            "is_rx": self.is_rx,
            "channel": self.channel,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> CanFrame:
        """The frame of a :meth:`to_payload` dict (flags missing from older output read as false, ``is_rx`` as true;
        a ``dlc`` of 9..15 with 8 data bytes of Classical CAN is the raw DLC).

        Raises ``UserInputError`` ``INVALID_FRAME`` (also for a timestamp :func:`checked_timestamp` refuses) /
        ``ValueError`` / ``KeyError`` / ``TypeError`` on a payload that is not a frame.
        """
        flag = functools.partial(_flag, payload)
        integer = functools.partial(_whole, payload)
        remote = flag("is_remote_frame")
        timestamp = payload.get("timestamp")
        dlc, fd, data = integer("dlc", 0), flag("is_fd"), bytes.fromhex(payload.get("data") or "")
        frame = cls(
            arbitration_id=integer("arbitration_id"),
            data=data,
            is_extended_id=flag("is_extended_id"),
            is_fd=fd,
            is_remote_frame=remote,
            timestamp=checked_timestamp(float(timestamp)) if timestamp is not None else 0.0,
            channel=payload.get("channel"),
            bitrate_switch=flag("bitrate_switch"),
            error_state_indicator=flag("error_state_indicator"),
            is_error_frame=flag("is_error_frame"),
            requested_dlc=dlc if remote else 0,
            is_rx=flag("is_rx", True),
            len8_dlc=dlc if not remote and not fd and len(data) == 8 and 9 <= dlc <= 15 else 0,
        )
        if not remote and "dlc" in payload and dlc != frame.dlc:
            raise ValueError(f"dlc {payload['dlc']} does not match the {len(frame.data)} data byte(s)")
        return frame


def _flag(payload: dict[str, Any], name: str, default: bool = False) -> bool:
    value = payload.get(name, default)
    if value.__class__ is not bool:  # "yes", 1: not what canarchy writes
        raise TypeError(f"{name} is {value!r}, not true or false")
    return value


def _whole(payload: dict[str, Any], name: str, default: Any = None) -> int:
    value = payload.get(name, default)
    if value.__class__ is not int:  # 291.5, true, "0x123"
        raise TypeError(f"{name} is {value!r}, not a whole number")
    return value


@dataclass(frozen=True)
class FrameFilter:
    """An arbitration-ID filter in candump's sense (can-utils ``candump.c``).

    A frame matches when ``frame_id & can_mask == can_id & can_mask`` and, when
    ``extended`` is not None, its ID kind is that one (True: 29-bit, False:
    11-bit; python-can's ``extended`` filter key); when ``remote`` is not None,
    whether it is a remote frame (candump's ``CAN_RTR_FLAG`` in the mask). An
    ``inverse`` filter passes exactly the frames the same filter without
    ``inverse`` would not. Error frames are not filtered by ID (as in candump).
    ``width_in_mask``: the mask held ``CAN_EFF_FLAG``, so candump checks the ID
    width too; without it candump passes either width (:meth:`matches` with
    ``as_candump``).
    """

    can_id: int
    can_mask: int
    extended: bool | None = None
    inverse: bool = False
    remote: bool | None = None
    width_in_mask: bool = False

    def matches(self, frame: CanFrame, as_candump: bool = False) -> bool:
        """Whether the filter passes ``frame``; ``as_candump``: as candump's would (the width unchecked unless
        :attr:`width_in_mask`)."""
        width = self.extended is None or frame.is_extended_id == self.extended or (as_candump and not
                                                                                     self.width_in_mask)
        hit = (width and (frame.arbitration_id & self.can_mask) == (self.can_id & self.can_mask)
               and (self.remote is None or frame.is_remote_frame == self.remote))
        return hit != self.inverse

    def to_payload(self) -> dict[str, Any]:
        """JSON form: ``{can_id, can_mask, extended, inverse, remote}``."""
        return {"can_id": self.can_id, "can_mask": self.can_mask, "extended": self.extended, "inverse": self.inverse,
                "remote": self.remote}


def to_message(frame: CanFrame, stamped: bool = False) -> Any:
    """``frame`` as a python-can ``can.Message`` (to send; ``stamped``: with its timestamp,
    channel and error flag, for a log writer)."""
    import can

    extra: dict[str, Any] = {}
    if stamped:
        extra = {"timestamp": frame.timestamp, "channel": frame.channel, "is_error_frame": frame.is_error_frame,
                 "is_rx": frame.is_rx}
        if frame.len8_dlc:  # python-can's BLF and ASC writers write the DLC field from it
            extra["dlc"] = frame.len8_dlc
    return can.Message(
        arbitration_id=frame.arbitration_id,
        data=frame.data,
        is_extended_id=frame.is_extended_id,
        is_fd=frame.is_fd,
        is_remote_frame=frame.is_remote_frame,
        bitrate_switch=frame.bitrate_switch,
        error_state_indicator=frame.error_state_indicator,
        **({"dlc": frame.requested_dlc if frame.is_remote_frame else None} | extra),
    )


def frame_passes(frame: CanFrame, filters: tuple[FrameFilter, ...] | list[FrameFilter],
                 as_candump: bool = False) -> bool:
    """True when there are no filters, ``frame`` is an error frame, or any filter passes it (candump: OR);
    ``as_candump``: as candump's filters would decide (:meth:`FrameFilter.matches`)."""
    return not filters or frame.is_error_frame or any(f.matches(frame, as_candump) for f in filters)


def python_can_filters(filters: tuple[FrameFilter, ...] | list[FrameFilter]) -> list[dict[str, Any]] | None:
    """The filters as python-can ``can_filters`` (which the interface may apply in the
    kernel or hardware), or None when there are none or any is inverse or about remote
    frames (python-can has neither: canarchy then applies them all itself)."""
    if not filters or any(f.inverse or f.remote is not None for f in filters):
        return None
    result = []
    for f in filters:
        entry: dict[str, Any] = {"can_id": f.can_id, "can_mask": f.can_mask}
        if f.extended is not None:
            entry["extended"] = f.extended
        result.append(entry)
    return result
