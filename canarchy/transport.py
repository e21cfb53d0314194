"""CAN transports: the python-can backend (live) and the scaffold backend (offline).

``PythonCanBackend._open_bus`` is the one place canarchy opens a real bus. It
passes everything explicitly and ``ignore_config=True``, so python-can's
ambient configuration (``CAN_INTERFACE``, ``~/.canrc``, ``can.rc``) can never
steer a canarchy bus. Every bus is shut down in a ``with`` block.

python-can is imported only inside ``_open_bus`` (``import can`` costs about
0.6 s); reference commands never pay for it.

Errors: :class:`canarchy.errors.TransportError` (CLI exit 2) with codes
``TRANSPORT_UNAVAILABLE``, ``TRANSPORT_SEND_FAILED``, ``TRANSPORT_RECEIVE_FAILED``;
``UserInputError`` ``INVALID_FRAME`` for a frame that does not fit;
:class:`canarchy.errors.ConfigError` for invalid configuration.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from canarchy import config
from canarchy.errors import TransportError, UserInputError

MAX_STANDARD_ID = 0x7FF
MAX_EXTENDED_ID = 0x1FFFFFFF
CAN_FD_DLCS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 48, 64)


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

    @property
    def dlc(self) -> int:
        """Data length in bytes."""
        return len(self.data)

    def to_payload(self) -> dict[str, Any]:
        """JSON form: ``{arbitration_id, data (hex), dlc, is_extended_id, is_fd, is_remote_frame, channel, timestamp}``."""
        return {
            "arbitration_id": self.arbitration_id,
            "data": self.data.hex(),
            "dlc": self.dlc,
            "is_extended_id": self.is_extended_id,
            "is_fd": self.is_fd,
            "is_remote_frame": self.is_remote_frame,
            "channel": self.channel,
            "timestamp": self.timestamp,
        }


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
    ``bus_type`` (python-can interface name), ``capture_limit`` (frames),
    ``capture_timeout`` (seconds of silence that ends a capture)."""

    backend: str
    bus_type: str
    capture_limit: int
    capture_timeout: float


def transport_backend_config() -> TransportConfig:
    """Resolve the transport settings (env > file > default; default python-can on socketcan).

    Raises ``ConfigError`` (``CONFIG_INVALID``, exit 1) on a bad value.
    """
    file_values = _load_user_config()

    def value(variable: str) -> Any:
        return config.resolve(variable, file_values=file_values)[0]

    return TransportConfig(
        backend=value("CANARCHY_TRANSPORT_BACKEND"),
        bus_type=value("CANARCHY_PYTHON_CAN_INTERFACE"),
        capture_limit=value("CANARCHY_CAPTURE_LIMIT"),
        capture_timeout=value("CANARCHY_CAPTURE_TIMEOUT"),
    )


def bus_unavailable(channel: str, bus_type: str, exc: BaseException) -> TransportError:
    """The ``TRANSPORT_UNAVAILABLE`` error (exit 2) for a bus python-can could not open."""
    return TransportError(
        "TRANSPORT_UNAVAILABLE",
        f"Cannot open channel {channel!r} on bus type {bus_type!r}: {exc}",
        "Check that the interface exists and is up (e.g. `ip link show can0`), "
        "or choose another bus type with [transport].interface.",
    )


class Backend:
    """The operations every backend offers. Channels are strings (``can0``, ``vcan0``)."""

    name = "abstract"

    def capture(self, channel: str, limit: int | None = None, timeout: float | None = None) -> Iterator[CanFrame]:
        """Yield received frames until ``limit`` frames (None: unbounded) or
        ``timeout`` seconds pass with no frame (None: the configured capture_timeout)."""
        raise NotImplementedError

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
    def session(self, channel: str) -> Iterator["BusSession"]:
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

    def _open_bus(self, channel: str):
        """Open ``channel`` on the configured bus type: THE place a real bus is opened.

        Raises ``TransportError`` (``TRANSPORT_UNAVAILABLE``) when python-can cannot open it.
        """
        try:
            import can

            return can.Bus(channel=channel, interface=self.bus_type, ignore_config=True, **self.bus_options)
        except Exception as exc:  # python-can raises many types; the user gets one code
            raise bus_unavailable(channel, self.bus_type, exc) from exc

    @staticmethod
    def _to_frame(message: Any, channel: str) -> CanFrame:
        return CanFrame(
            arbitration_id=message.arbitration_id,
            data=bytes(message.data),
            is_extended_id=message.is_extended_id,
            is_fd=message.is_fd,
            is_remote_frame=message.is_remote_frame,
            timestamp=message.timestamp or time.time(),
            channel=channel,
        )

    @staticmethod
    def _to_message(frame: CanFrame):
        import can

        return can.Message(
            arbitration_id=frame.arbitration_id,
            data=frame.data,
            is_extended_id=frame.is_extended_id,
            is_fd=frame.is_fd,
            is_remote_frame=frame.is_remote_frame,
        )

    def capture(self, channel: str, limit: int | None = None, timeout: float | None = None) -> Iterator[CanFrame]:
        timeout = self.capture_timeout if timeout is None else timeout
        with self._open_bus(channel) as bus:
            count = 0
            while limit is None or count < limit:
                message = self._recv_on(bus, channel, timeout)
                if message is None:
                    if limit is None:
                        continue  # unbounded capture streams until interrupted
                    return
                count += 1
                yield self._to_frame(message, channel)

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
            def recv(timeout: float) -> CanFrame | None:
                message = self._recv_on(bus, channel, max(0.0, timeout))
                return None if message is None else self._to_frame(message, channel)

            yield BusSession(lambda frame: self._send_on(bus, channel, frame), recv)

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

    def capture(self, channel: str, limit: int | None = None, timeout: float | None = None) -> Iterator[CanFrame]:
        self._check(channel)
        count = len(self.FRAMES) if limit is None else limit
        for index in range(count):
            base = self.FRAMES[index % len(self.FRAMES)]
            yield CanFrame(base.arbitration_id, base.data, base.is_extended_id, base.is_fd, False,
                           base.timestamp + index * 0.001, channel)

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
    return PythonCanBackend(settings.bus_type, settings.capture_limit, settings.capture_timeout)
