"""CAN transports: the python-can backend (live) and the scaffold backend (offline).

``PythonCanBackend._open_bus`` is the one place canarchy opens a real bus: every option explicit and
``ignore_config=True``, so python-can's own configuration never steers it; buses are shut down in ``with``
blocks. python-can is imported only when a bus is opened. The frames they carry: :mod:`canarchy.frames`.
Errors: ``TransportError`` (exit 2) ``TRANSPORT_UNAVAILABLE``, ``TRANSPORT_SEND_FAILED``,
``TRANSPORT_RECEIVE_FAILED``; ``ConfigError``. Design: ``docs/design/cli.md`` ("Transport").
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterator

from canarchy import config
from canarchy.errors import TransportError
from canarchy.frames import CanFrame, FrameFilter, frame_passes, python_can_filters, to_message

#: Longest wait of one receive call in a capture (s): how soon a capture sees its stop conditions.
CAPTURE_POLL_S = 0.1


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


#: What to check when a bus type's channel does not open (``{channel}``: the channel asked for).
_UNAVAILABLE_HINTS = {
    "socketcan": "Check that the interface exists and is up (`ip link show {channel}`), or choose another bus type "
                 "with [transport].interface.",
    "udp_multicast": "The group needs a network interface that is up besides loopback (any: Ethernet, Wi-Fi; "
                     "`ip link`), or choose another bus type with [transport].interface.",
}
_UNAVAILABLE_HINT = ("Check that the adapter is connected and its driver installed (python-can's page for this bus "
                     "type), or choose another bus type with [transport].interface.")


def bus_unavailable(channel: str, bus_type: str, exc: BaseException) -> TransportError:
    """The ``TRANSPORT_UNAVAILABLE`` error (exit 2) for a bus python-can could not open: its message, and the
    operating system's reason where python-can's hides it (``could not create or configure socket``)."""
    cause = exc.__cause__ or exc.__context__
    reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else None
    shown = f"{exc} ({reason})" if reason and reason not in str(exc) else str(exc)
    return TransportError(
        "TRANSPORT_UNAVAILABLE",
        f"Cannot open channel {channel!r} on bus type {bus_type!r}: {shown}",
        _UNAVAILABLE_HINTS.get(bus_type, _UNAVAILABLE_HINT).format(channel=channel),
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
            is_rx=bool(getattr(message, "is_rx", True)),
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
