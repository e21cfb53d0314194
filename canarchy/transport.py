"""CAN transports: the python-can backend (live) and the scaffold backend (offline).

``PythonCanBackend._open_bus`` is the one place canarchy opens a real bus: every option explicit and
``ignore_config=True``, so python-can's own configuration never steers it; buses are shut down in ``with``
blocks. python-can is imported only when a bus is opened or a message built. Errors: ``TransportError``
(exit 2) ``TRANSPORT_UNAVAILABLE``, ``TRANSPORT_SEND_FAILED``, ``TRANSPORT_RECEIVE_FAILED``; ``UserInputError``
``INVALID_FRAME``; ``ConfigError``. Design: ``docs/design/cli.md`` ("Transport").
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterator

from canarchy import config
from canarchy.errors import TransportError, UserInputError

MAX_STANDARD_ID = 0x7FF
MAX_EXTENDED_ID = 0x1FFFFFFF
CAN_FD_DLCS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 48, 64)
#: Longest wait of one receive call in a capture (s): how soon a capture sees its stop conditions.
CAPTURE_POLL_S = 0.1


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
    seen or sent.
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
        if (self.bitrate_switch or self.error_state_indicator) and not self.is_fd:
            raise UserInputError("INVALID_FRAME", "Bit rate switch (BRS) and ESI are flags of CAN FD frames only.",
                                 "Send a CAN FD frame (ID##<flags><data>, or --fd) to set BRS or ESI.")
        if self.is_remote_frame and (self.is_fd or self.data):
            raise UserInputError("INVALID_FRAME", "A remote frame carries no data and CAN FD has no remote frames "
                                 "(ISO 11898-1).", "Send ID#R or ID#R<DLC> (classic CAN), without data.")
        if not 0 <= self.requested_dlc <= 15:
            raise UserInputError("INVALID_FRAME", f"Remote frame DLC {self.requested_dlc} is outside 0..15.",
                                 "Give the requested DLC as one hex digit, e.g. 123#R8.")

    @property
    def dlc(self) -> int:
        """Data length in bytes; for a remote frame the DLC it requests."""
        return self.requested_dlc if self.is_remote_frame else len(self.data)

    def to_payload(self) -> dict[str, Any]:
        """JSON form: ``{arbitration_id, data (hex), dlc, is_extended_id, is_fd, is_remote_frame,
        bitrate_switch, error_state_indicator, is_error_frame, channel, timestamp}``."""
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
            "channel": self.channel,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> CanFrame:
        """The frame of a :meth:`to_payload` dict (flags missing from older output read as false).

        Raises ``UserInputError`` ``INVALID_FRAME`` / ``ValueError`` / ``KeyError`` /
        ``TypeError`` on a payload that is not a frame.
        """
        remote = bool(payload.get("is_remote_frame", False))
        flag = lambda name: bool(payload.get(name, False))  # noqa: E731
        timestamp = payload.get("timestamp")
        return cls(
            arbitration_id=int(payload["arbitration_id"]),
            data=bytes.fromhex(payload.get("data") or ""),
            is_extended_id=flag("is_extended_id"),
            is_fd=flag("is_fd"),
            is_remote_frame=remote,
            timestamp=float(timestamp) if timestamp is not None else 0.0,
            channel=payload.get("channel"),
            bitrate_switch=flag("bitrate_switch"),
            error_state_indicator=flag("error_state_indicator"),
            is_error_frame=flag("is_error_frame"),
            requested_dlc=int(payload.get("dlc") or 0) if remote else 0,
        )


@dataclass(frozen=True)
class FrameFilter:
    """An arbitration-ID filter in candump's sense (can-utils ``candump.c``).

    A frame matches when ``frame_id & can_mask == can_id & can_mask`` and, when
    ``extended`` is not None, its ID kind is that one (True: 29-bit, False:
    11-bit; python-can's ``extended`` filter key). An ``inverse`` filter passes
    exactly the frames the same filter without ``inverse`` would not. Error
    frames are not filtered by ID (as in candump).
    """

    can_id: int
    can_mask: int
    extended: bool | None = None
    inverse: bool = False

    def matches(self, frame: CanFrame) -> bool:
        hit = (frame.arbitration_id & self.can_mask) == (self.can_id & self.can_mask) and (
            self.extended is None or frame.is_extended_id == self.extended)
        return hit != self.inverse

    def to_payload(self) -> dict[str, Any]:
        """JSON form: ``{can_id, can_mask, extended, inverse}``."""
        return {"can_id": self.can_id, "can_mask": self.can_mask, "extended": self.extended, "inverse": self.inverse}


def to_message(frame: CanFrame, stamped: bool = False) -> Any:
    """``frame`` as a python-can ``can.Message`` (to send; ``stamped``: with its timestamp,
    channel and error flag, for a log writer)."""
    import can

    extra: dict[str, Any] = {}
    if stamped:
        extra = {"timestamp": frame.timestamp, "channel": frame.channel, "is_error_frame": frame.is_error_frame}
    return can.Message(
        arbitration_id=frame.arbitration_id,
        data=frame.data,
        is_extended_id=frame.is_extended_id,
        is_fd=frame.is_fd,
        is_remote_frame=frame.is_remote_frame,
        bitrate_switch=frame.bitrate_switch,
        error_state_indicator=frame.error_state_indicator,
        dlc=frame.requested_dlc if frame.is_remote_frame else None,
        **extra,
    )


def frame_passes(frame: CanFrame, filters: tuple[FrameFilter, ...] | list[FrameFilter]) -> bool:
    """True when there are no filters, ``frame`` is an error frame, or any filter passes it (candump: OR)."""
    return not filters or frame.is_error_frame or any(f.matches(frame) for f in filters)


def python_can_filters(filters: tuple[FrameFilter, ...] | list[FrameFilter]) -> list[dict[str, Any]] | None:
    """The filters as python-can ``can_filters`` (which the interface may apply in the
    kernel or hardware), or None when there are none or any is inverse (python-can has
    no inverse filters: canarchy then applies them all itself)."""
    if not filters or any(f.inverse for f in filters):
        return None
    result = []
    for f in filters:
        entry: dict[str, Any] = {"can_id": f.can_id, "can_mask": f.can_mask}
        if f.extended is not None:
            entry["extended"] = f.extended
        result.append(entry)
    return result


def _load_user_config() -> dict[str, Any]:
    """Return the values of ``~/.canarchy/config.toml`` keyed by variable name.

    ``{"CANARCHY_DEFAULT_INTERFACE": "vcan7", ...}``; a missing file reads as
    ``{}``. Raises ``ConfigError`` (``CONFIG_INVALID``) when the file does not parse.
    """
    return config.load_file_values()


def _setting(variable: str) -> Any:
    value, _source = config.resolve(variable, file_values=_load_user_config())
    return value


def default_can_interface() -> str | None:
    """The configured default channel (``[transport].default_interface`` or
    ``CANARCHY_DEFAULT_INTERFACE``; the variable wins when non-empty), or None."""
    return _setting("CANARCHY_DEFAULT_INTERFACE")


@dataclass(frozen=True)
class TransportConfig:
    """Resolved transport settings: ``backend`` (``python-can``/``scaffold``),
    ``bus_type`` (python-can interface name), ``capture_limit`` (the default
    ``capture --count``; None: until stopped), ``capture_timeout`` (the default
    ``capture --idle-timeout`` in seconds; None: no idle stop), and the bus
    parameters passed to python-can when set: ``bitrate``, ``data_bitrate``
    (bit/s), ``fd``, ``bus_kwargs`` (other keyword arguments)."""

    backend: str
    bus_type: str
    capture_limit: int | None = None
    capture_timeout: float | None = None
    bitrate: int | None = None
    data_bitrate: int | None = None
    fd: bool | None = None
    bus_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def bus_options(self) -> dict[str, Any]:
        """The keyword arguments for ``can.Bus`` besides channel and interface."""
        options = dict(self.bus_kwargs)
        for name in ("bitrate", "data_bitrate", "fd"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        return options


#: Command-line flag values by variable (see :func:`transport_backend_config`).
BusFlags = dict[str, Any]


def transport_backend_config(flags: BusFlags | None = None) -> TransportConfig:
    """Resolve the transport settings (flag > env > file > default; default python-can on socketcan).

    ``flags`` maps variables (``CANARCHY_BITRATE`` ...) to command-line values
    (None: not given). Raises ``ConfigError`` (``CONFIG_INVALID``, exit 1) on a bad value.
    """
    resolved = config.load_config(flags)

    def value(variable: str) -> Any:
        return resolved[variable]["value"]

    return TransportConfig(
        backend=value("CANARCHY_TRANSPORT_BACKEND"),
        bus_type=value("CANARCHY_PYTHON_CAN_INTERFACE"),
        capture_limit=value("CANARCHY_CAPTURE_LIMIT"),
        capture_timeout=value("CANARCHY_CAPTURE_TIMEOUT"),
        bitrate=value("CANARCHY_BITRATE"),
        data_bitrate=value("CANARCHY_DATA_BITRATE"),
        fd=value("CANARCHY_BUS_FD"),
        bus_kwargs=value("CANARCHY_BUS_KWARGS"),
    )


def bus_unavailable(channel: str, bus_type: str, exc: BaseException) -> TransportError:
    """The ``TRANSPORT_UNAVAILABLE`` error (exit 2) for a bus python-can could not open."""
    return TransportError(
        "TRANSPORT_UNAVAILABLE",
        f"Cannot open channel {channel!r} on bus type {bus_type!r}: {exc}",
        "Check that the interface exists and is up (e.g. `ip link show can0`), "
        "or choose another bus type with [transport].interface.",
    )


class SourceEnded(Exception):
    """A receiver has no more frames (the scaffold's fixed frames are out); a bus never ends."""


class Backend:
    """The operations every backend offers. Channels are strings (``can0``, ``vcan0``)."""

    name = "abstract"

    @contextmanager
    def receiver(self, channel: str,
                 filters: tuple[FrameFilter, ...] = ()) -> Iterator[Callable[[float], CanFrame | None]]:
        """A ``recv(timeout) -> CanFrame | None`` function on one open channel: the
        next frame that passes ``filters`` (:func:`frame_passes`), or None when
        none came within ``timeout`` seconds (or one that did not pass came).
        Raises ``TransportError`` (``TRANSPORT_UNAVAILABLE``, ``TRANSPORT_RECEIVE_FAILED``),
        :class:`SourceEnded` when a source has no more frames."""
        raise NotImplementedError
        yield  # pragma: no cover

    def capture(self, channel: str, limit: int | None = None, timeout: float | None = None,
                filters: tuple[FrameFilter, ...] = ()) -> Iterator[CanFrame]:
        """Yield received frames that pass ``filters`` until ``limit`` frames (None:
        unbounded) or ``timeout`` seconds pass with no frame (None: no idle stop)."""
        with self.receiver(channel, filters) as recv:
            count = 0
            last = time.monotonic()
            while limit is None or count < limit:
                wait = (CAPTURE_POLL_S if timeout is None
                        else max(0.0, min(CAPTURE_POLL_S, last + timeout - time.monotonic())))
                try:
                    frame = recv(wait)
                except SourceEnded:
                    return
                now = time.monotonic()
                if frame is None:
                    if timeout is not None and now - last >= timeout:
                        return
                    continue
                count += 1
                last = now
                yield frame

    def send(self, channel: str, frame: CanFrame) -> CanFrame:
        """Transmit one frame; return it as sent (timestamp set)."""
        raise NotImplementedError

    @contextmanager
    def sender(self, channel: str) -> Iterator[Callable[[CanFrame], None]]:
        """A ``send(frame)`` function for many frames in a row (``generate``).

        The python-can backend opens one bus for the whole block; others send
        frame by frame. Raises what :meth:`send` raises.
        """
        yield lambda frame: self.send(channel, frame)

    @contextmanager
    def session(self, channel: str) -> Iterator[BusSession]:
        """One bus for a whole exchange of many frames (UDS discovery, a fuzz
        campaign): a :class:`BusSession` with ``send(frame) -> send time`` and
        ``recv(timeout) -> CanFrame | None``. Raises what :meth:`send` raises."""
        raise NotImplementedError
        yield  # pragma: no cover

    def transaction(self, channel: str, request: CanFrame, accept: Callable[[CanFrame], bool],
                    timeout: float, settle: Callable[[CanFrame], bool] | None = None) -> list[CanFrame]:
        """Send ``request`` and collect replies for which ``accept`` is true, on
        one bus opened before sending. Collection ends ``timeout`` seconds after
        the last accepted reply for which ``settle`` (default: every reply) is
        false, i.e. a reply for which ``settle`` is true (e.g. UDS 0x78
        response-pending) extends the wait."""
        raise NotImplementedError


class BusSession:
    """A bus held open by :meth:`Backend.session`: ``send(frame)`` transmits and
    returns the send time (s since the epoch), ``recv(timeout)`` returns the next
    frame within ``timeout`` seconds or None. ``sent``: frames sent so far."""

    def __init__(self, send: Callable[[CanFrame], None], recv: Callable[[float], CanFrame | None]) -> None:
        self._send = send
        self._recv = recv
        self.sent = 0

    def send(self, frame: CanFrame) -> float:
        sent_at = time.time()
        self._send(frame)
        self.sent += 1
        return sent_at

    def recv(self, timeout: float) -> CanFrame | None:
        return self._recv(timeout)


class PythonCanBackend(Backend):
    """Live transport through python-can on the configured bus type."""

    name = "python-can"

    def __init__(self, bus_type: str = "socketcan", capture_limit: int = 2, capture_timeout: float = 0.05,
                 bus_options: dict[str, Any] | None = None) -> None:
        self.bus_type = bus_type
        self.capture_limit = capture_limit
        self.capture_timeout = capture_timeout
        self.bus_options = dict(bus_options or {})

    def _open_bus(self, channel: str, can_filters: list[dict[str, Any]] | None = None):
        """Open ``channel`` on the configured bus type: THE place a real bus is opened.

        ``bus_options`` (bit rates, ``fd``, ``[transport.bus_kwargs]``) and
        ``can_filters`` go to ``can.Bus``; python-can's own configuration is ignored.
        Raises ``TransportError`` (``TRANSPORT_UNAVAILABLE``) when python-can cannot open it.
        """
        options = dict(self.bus_options)
        if can_filters:
            options["can_filters"] = can_filters
        try:
            import can

            return can.Bus(channel=channel, interface=self.bus_type, ignore_config=True, **options)
        except Exception as exc:  # python-can raises many types; the user gets one code
            raise bus_unavailable(channel, self.bus_type, exc) from exc

    @staticmethod
    def _to_frame(message: Any, channel: str) -> CanFrame:
        remote = bool(message.is_remote_frame)
        return CanFrame(
            arbitration_id=message.arbitration_id,
            data=b"" if remote else bytes(message.data),
            is_extended_id=message.is_extended_id,
            is_fd=message.is_fd,
            is_remote_frame=remote,
            timestamp=message.timestamp or time.time(),
            channel=channel,
            bitrate_switch=bool(message.is_fd and message.bitrate_switch),
            error_state_indicator=bool(message.is_fd and message.error_state_indicator),
            is_error_frame=bool(message.is_error_frame),
            requested_dlc=min(int(message.dlc), 15) if remote else 0,
        )

    @staticmethod
    def _to_message(frame: CanFrame):
        return to_message(frame)

    def _receive_function(self, bus: Any, channel: str,
                          filters: tuple[FrameFilter, ...] = ()) -> Callable[[float], CanFrame | None]:
        def recv(timeout: float) -> CanFrame | None:
            message = self._recv_on(bus, channel, max(0.0, timeout))
            if message is None:
                return None
            frame = self._to_frame(message, channel)
            return frame if frame_passes(frame, filters) else None

        return recv

    @contextmanager
    def receiver(self, channel: str,
                 filters: tuple[FrameFilter, ...] = ()) -> Iterator[Callable[[float], CanFrame | None]]:
        can_filters = python_can_filters(filters)
        with (self._open_bus(channel, can_filters) if can_filters else self._open_bus(channel)) as bus:
            yield self._receive_function(bus, channel, filters)

    def send(self, channel: str, frame: CanFrame) -> CanFrame:
        with self._open_bus(channel) as bus:
            self._send_on(bus, channel, frame)
        return frame

    @contextmanager
    def sender(self, channel: str) -> Iterator[Callable[[CanFrame], None]]:
        with self._open_bus(channel) as bus:
            yield lambda frame: self._send_on(bus, channel, frame)

    @contextmanager
    def session(self, channel: str) -> Iterator[BusSession]:
        with self._open_bus(channel) as bus:
            yield BusSession(lambda frame: self._send_on(bus, channel, frame), self._receive_function(bus, channel))

    def _send_on(self, bus: Any, channel: str, frame: CanFrame) -> None:
        try:
            bus.send(self._to_message(frame))
        except Exception as exc:
            raise TransportError(
                "TRANSPORT_SEND_FAILED",
                f"Sending 0x{frame.arbitration_id:X} on {channel!r} failed: {exc}",
                "Check the bus state (bus-off, no other node acknowledging) and the bit rate.",
            ) from exc

    @staticmethod
    def _recv_on(bus: Any, channel: str, timeout: float) -> Any:
        try:
            return bus.recv(timeout=timeout)
        except Exception as exc:
            raise TransportError(
                "TRANSPORT_RECEIVE_FAILED",
                f"Receiving on {channel!r} failed: {exc}",
                "Check that the interface is still up and the bus is not in bus-off.",
            ) from exc

    def transaction(self, channel: str, request: CanFrame, accept: Callable[[CanFrame], bool],
                    timeout: float, settle: Callable[[CanFrame], bool] | None = None) -> list[CanFrame]:
        replies: list[CanFrame] = []
        with self._open_bus(channel) as bus:
            self._send_on(bus, channel, request)
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                message = self._recv_on(bus, channel, remaining)
                if message is None:
                    break
                frame = self._to_frame(message, channel)
                if not accept(frame):
                    continue
                replies.append(frame)
                if settle is not None and settle(frame):
                    deadline = time.monotonic() + timeout
                    continue
                break
        return replies


SCAFFOLD_UNAVAILABLE = ("offline0", "down0", "missing0")


class ScaffoldBackend(Backend):
    """Deterministic offline backend: fixed frames, echoes sends.

    Channels ``offline0``, ``down0`` and ``missing0`` raise
    ``TRANSPORT_UNAVAILABLE`` so the error path can be exercised.
    """

    name = "scaffold"
    FRAMES = (
        CanFrame(0x0CF00400, bytes.fromhex("607D84481400F084"), is_extended_id=True, timestamp=1635188455.0299),
        CanFrame(0x18FEF100, bytes.fromhex("F7000004000000FF"), is_extended_id=True, timestamp=1635188455.0309),
        CanFrame(0x7E8, bytes.fromhex("0641010027E100CC"), timestamp=1725694999.693250),
    )

    def __init__(self, capture_limit: int = 2, capture_timeout: float = 0.05) -> None:
        self.capture_limit = capture_limit
        self.capture_timeout = capture_timeout
        self.sent: list[CanFrame] = []

    def _check(self, channel: str) -> None:
        if channel in SCAFFOLD_UNAVAILABLE:
            raise TransportError(
                "TRANSPORT_UNAVAILABLE",
                f"Scaffold channel {channel!r} is unavailable by design.",
                "Use another channel name with the scaffold backend (e.g. scaffold0).",
            )

    @contextmanager
    def receiver(self, channel: str,
                 filters: tuple[FrameFilter, ...] = ()) -> Iterator[Callable[[float], CanFrame | None]]:
        """The fixed frames, at once, then :class:`SourceEnded`."""
        self._check(channel)
        frames = iter(self.FRAMES)

        def recv(timeout: float) -> CanFrame | None:
            base = next(frames, None)
            if base is None:
                raise SourceEnded(channel)
            frame = CanFrame(base.arbitration_id, base.data, base.is_extended_id, base.is_fd, False, base.timestamp,
                             channel)
            return frame if frame_passes(frame, filters) else None

        yield recv

    def send(self, channel: str, frame: CanFrame) -> CanFrame:
        self._check(channel)
        self.sent.append(frame)
        return frame

    def transaction(self, channel: str, request: CanFrame, accept: Callable[[CanFrame], bool],
                    timeout: float, settle: Callable[[CanFrame], bool] | None = None) -> list[CanFrame]:
        self._check(channel)
        self.sent.append(request)
        return []

    @contextmanager
    def session(self, channel: str) -> Iterator[BusSession]:
        self._check(channel)
        yield BusSession(self.sent.append, lambda timeout: None)  # nothing ever answers


def build_backend(settings: TransportConfig | None = None) -> Backend:
    """Return the configured backend (:func:`transport_backend_config` when not given)."""
    settings = transport_backend_config() if settings is None else settings
    if settings.backend == "scaffold":
        return ScaffoldBackend(settings.capture_limit, settings.capture_timeout)
    return PythonCanBackend(settings.bus_type, settings.capture_limit, settings.capture_timeout,
                            bus_options=settings.bus_options)
