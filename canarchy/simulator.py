"""Simulated UDS ECUs: the real peers active commands are tested against.

:class:`SimulatedEcu` is one ECU on its own python-can bus; :class:`SimulatedNetwork` puts several
:class:`EcuNode` objects (one may be ``silent``) on one bus. They answer UDS (ISO 14229-1) over ISO-TP
(ISO 15765-2) from a background thread, open their bus with ``ignore_config=True`` and shut it down on exit;
``requests``/``messages``/``responses`` record what crossed the bus. Usage, the default :class:`EcuProfile`
and ``python -m canarchy.simulator``: ``docs/fuzz-guided.md``.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import logging
import sys
import threading
import time
from typing import Any
from collections.abc import Callable, Sequence

from canarchy.isotp import (CF_DATA, CLASSIC_FRAME, FF_DATA, FF_MAX_LENGTH, FLOW_STATUS_CONTINUE,
                            FLOW_STATUS_WAIT, PCI_CONSECUTIVE, PCI_FIRST, PCI_FLOW_CONTROL, PCI_SINGLE, SF_MAX,
                            flow_control, single_frame_payload, st_min_seconds)
from canarchy.uds_server import EcuProfile, UdsServer

_log = logging.getLogger(__name__)


class EcuNode:
    """One simulated ECU on a shared bus: its addresses, its UDS state, and what crossed the bus for it.

    ``request_id`` / ``response_id``: physical request and response arbitration
    IDs (29-bit when > 0x7FF); ``profile``: :class:`EcuProfile`; ``name``: a
    label. Readable while it runs: ``requests`` (data of every frame received
    on the request ID, ``list[bytes]``), ``messages`` (reassembled UDS
    requests), ``responses`` (data of every frame sent), ``server`` (the UDS
    state machine). Frames go out through the bus that hosts it
    (:class:`SimulatedEcu`, :class:`SimulatedNetwork`).
    """

    def __init__(self, request_id: int = 0x7E0, response_id: int | None = None, profile: EcuProfile | None = None,
                 name: str | None = None) -> None:
        self.request_id = request_id
        self.response_id = request_id + 8 if response_id is None else response_id
        self.profile = EcuProfile() if profile is None else profile
        self.name = name or f"ecu-0x{request_id:X}"
        self.requests: list[bytes] = []
        self.messages: list[bytes] = []
        self.responses: list[bytes] = []
        self.server = UdsServer(self.profile)
        self._host: _BusHost | None = None
        self._rx: dict[str, Any] | None = None   # segmented request being received
        self._tx: dict[str, Any] | None = None   # segmented response being sent

    @property
    def busy(self) -> bool:
        """True while a segmented response waits for the tester's flow control or is being sent."""
        return self._tx is not None

    # -- ISO-TP reception --

    def on_message(self, message: Any) -> None:
        """Take one frame seen on the bus (any ID)."""
        if message.arbitration_id != self.request_id or message.is_extended_id != (self.request_id > 0x7FF):
            return
        if message.is_remote_frame or message.is_error_frame:
            return
        data = bytes(message.data)
        self.requests.append(data)
        if not data or self.profile.silent:
            return
        kind = data[0] >> 4
        if kind == PCI_SINGLE:
            self._on_single_frame(data)
        elif kind == PCI_FIRST:
            self._on_first_frame(data)
        elif kind == PCI_CONSECUTIVE:
            self._on_consecutive_frame(data)
        elif kind == PCI_FLOW_CONTROL:
            self._on_flow_control(data)
        # other PCI types are reserved: ignored (ISO 15765-2)

    def _on_single_frame(self, data: bytes) -> None:
        payload = single_frame_payload(data)
        if payload is None or (len(data) > CLASSIC_FRAME and len(payload) <= SF_MAX and data[0] & 0x0F == 0):
            return  # invalid SF_DL (an FD escape must carry more than a classic frame could): ignored
        self._rx = None  # a new single frame ends a reception in progress
        self._on_request(payload)

    def _on_first_frame(self, data: bytes) -> None:
        length = ((data[0] & 0x0F) << 8) | data[1] if len(data) >= 2 else 0
        if len(data) != CLASSIC_FRAME or length <= SF_MAX:
            return  # a first frame uses the whole frame and more than a single frame holds
        self._tx = None  # a new request cancels a response still being sent
        self._rx = {"length": length, "data": bytearray(data[2:]), "sn": 1, "block": 0,
                    "deadline": time.monotonic() + self.profile.n_timeout}
        self._send_frame(self._flow_control())

    def _flow_control(self) -> bytes:
        return flow_control(FLOW_STATUS_CONTINUE, self.profile.block_size, self.profile.st_min, padding=None)

    def _on_consecutive_frame(self, data: bytes) -> None:
        rx = self._rx
        if rx is None:
            return
        if time.monotonic() > rx["deadline"] or data[0] & 0x0F != rx["sn"]:
            self._rx = None  # N_Cr timeout or wrong sequence number: reception aborted
            return
        rx["data"] += data[1:]
        rx["sn"] = (rx["sn"] + 1) & 0x0F
        rx["deadline"] = time.monotonic() + self.profile.n_timeout
        if len(rx["data"]) >= rx["length"]:
            self._rx = None
            self._on_request(bytes(rx["data"][:rx["length"]]))
            return
        rx["block"] += 1
        if self.profile.block_size and rx["block"] >= self.profile.block_size:
            rx["block"] = 0
            self._send_frame(self._flow_control())

    def _on_flow_control(self, data: bytes) -> None:
        tx = self._tx
        if tx is None or not tx["awaiting_fc"]:
            return
        if time.monotonic() > tx["deadline"]:
            self._tx = None  # N_Bs timeout: transmission aborted
            return
        status = data[0] & 0x0F
        if status == FLOW_STATUS_WAIT:
            tx["deadline"] = time.monotonic() + self.profile.n_timeout
            return
        if status != FLOW_STATUS_CONTINUE or len(data) < 3:
            self._tx = None  # overflow or invalid flow status: abort
            return
        tx["awaiting_fc"] = False
        tx["block_size"] = data[1]
        tx["st_min"] = st_min_seconds(data[2])
        tx["sent_in_block"] = 0
        self._send_next_consecutive(tx)

    # -- UDS and ISO-TP transmission --

    def _on_request(self, payload: bytes) -> None:
        self.messages.append(payload)
        for reply in self.server.handle(payload, time.monotonic()):
            if reply.delay > 0:
                self._host.after(reply.delay, lambda p=reply.payload: self._send_payload(p))
            else:
                self._send_payload(reply.payload)

    def _send_payload(self, payload: bytes) -> None:
        if len(payload) <= SF_MAX:
            self._send_frame(bytes((len(payload),)) + payload)
            return
        if len(payload) > FF_MAX_LENGTH:
            _log.warning("simulated ECU: %d-byte response does not fit ISO-TP; dropped", len(payload))
            return
        self._send_frame(bytes((PCI_FIRST << 4 | len(payload) >> 8, len(payload) & 0xFF)) + payload[:FF_DATA])
        self._tx = {"payload": payload, "offset": FF_DATA, "sn": 1, "awaiting_fc": True,
                    "deadline": time.monotonic() + self.profile.n_timeout}

    def _send_next_consecutive(self, tx: dict[str, Any]) -> None:
        if self._tx is not tx:
            return  # cancelled by a newer request
        payload = tx["payload"]
        chunk = payload[tx["offset"]:tx["offset"] + CF_DATA]
        self._send_frame(bytes((PCI_CONSECUTIVE << 4 | tx["sn"],)) + chunk)
        tx["offset"] += len(chunk)
        tx["sn"] = (tx["sn"] + 1) & 0x0F
        tx["sent_in_block"] += 1
        if tx["offset"] >= len(payload):
            self._tx = None
            return
        if tx["block_size"] and tx["sent_in_block"] >= tx["block_size"]:
            tx["awaiting_fc"] = True
            tx["deadline"] = time.monotonic() + self.profile.n_timeout
            return
        if tx["st_min"] > 0:
            self._host.after(tx["st_min"], lambda: self._send_next_consecutive(tx))
        else:
            self._send_next_consecutive(tx)

    def _send_frame(self, data: bytes) -> None:
        if self.profile.padding is not None and len(data) < CLASSIC_FRAME:
            data = data + bytes((self.profile.padding,)) * (CLASSIC_FRAME - len(data))
        self._host.send(self.response_id, data)
        self.responses.append(data)


class _BusHost:
    """One python-can bus and the thread that serves the :class:`EcuNode` objects on it.

    Opens its bus with ``ignore_config=True``; on :meth:`stop` it stops the
    thread, joins it and shuts the bus down. ``error``: an exception that
    ended the thread, or None.
    """

    def __init__(self, bus_type: str, channel: str, nodes: Sequence[EcuNode],
                 bus_options: dict[str, Any] | None = None) -> None:
        self.bus_type = bus_type
        self.channel = channel
        self.bus_options = dict(bus_options or {})
        self.nodes = list(nodes)
        for node in self.nodes:
            node._host = self
        self.error: BaseException | None = None
        self._bus: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_order = itertools.count()

    # -- lifecycle --

    def start(self) -> _BusHost:
        """Open the bus and start answering. Idempotent. Raises whatever python-can raises."""
        if self._bus is not None:
            return self
        import can

        self._bus = can.Bus(channel=self.channel, interface=self.bus_type, ignore_config=True, **self.bus_options)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"SimulatedEcu-{self.channel}", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._bus.shutdown()
            self._bus = None
            raise
        return self

    def stop(self) -> None:
        """Stop the thread, join it, and shut the bus down. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self._bus is not None:
            bus, self._bus = self._bus, None
            bus.shutdown()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while the answering thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def busy(self) -> bool:
        """True while an answer is still to go out: a delayed or pending reply,
        or a segmented response waiting for the tester's flow control."""
        return bool(self._timers) or any(node.busy for node in self.nodes)

    # -- the loop --

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._fire_due_timers()
                wait = 0.02
                if self._timers:
                    wait = max(0.0, min(wait, self._timers[0][0] - time.monotonic()))
                message = self._bus.recv(timeout=wait)
                if message is not None:
                    for node in self.nodes:
                        node.on_message(message)
        except BaseException as exc:  # recorded for the test; the bus is still shut down by stop()
            self.error = exc
            _log.exception("simulated ECU on %s stopped", self.channel)

    def after(self, delay: float, action: Callable[[], None]) -> None:
        """Run ``action`` on the bus thread ``delay`` seconds from now."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_order), action))

    def _fire_due_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _due, _order, action = heapq.heappop(self._timers)
            action()

    def send(self, arbitration_id: int, data: bytes) -> None:
        """Transmit one classic CAN frame (29-bit when ``arbitration_id`` > 0x7FF)."""
        import can

        self._bus.send(can.Message(arbitration_id=arbitration_id, data=data, is_extended_id=arbitration_id > 0x7FF,
                                   is_fd=False))


class SimulatedEcu(_BusHost):
    """One UDS ECU on its own python-can bus, answering in a background thread.

    ``bus_type``: python-can interface name (``virtual`` in tests);
    ``channel``: the channel to open (a unique name per test on ``virtual``);
    ``request_id`` / ``response_id``: physical request and response
    arbitration IDs (29-bit when > 0x7FF); ``profile``: :class:`EcuProfile`.

    Use as a context manager (or ``start()`` / ``stop()``). ``requests``,
    ``messages``, ``responses``, ``server`` and ``profile`` are those of its
    :class:`EcuNode` (``node``); ``error``: an exception that ended the thread.

    Raises whatever python-can raises when the bus cannot be opened.
    """

    def __init__(self, bus_type: str = "virtual", channel: str = "canarchy-sim", request_id: int = 0x7E0,
                 response_id: int | None = None, profile: EcuProfile | None = None,
                 bus_options: dict[str, Any] | None = None) -> None:
        self.node = EcuNode(request_id, response_id, profile)
        super().__init__(bus_type, channel, [self.node], bus_options)

    request_id = property(lambda self: self.node.request_id)
    response_id = property(lambda self: self.node.response_id)
    profile = property(lambda self: self.node.profile)
    server = property(lambda self: self.node.server)
    requests = property(lambda self: self.node.requests)
    messages = property(lambda self: self.node.messages)
    responses = property(lambda self: self.node.responses)


class SimulatedNetwork(_BusHost):
    """Several ECUs (:class:`EcuNode`) on one python-can bus, served by one thread::

        with SimulatedNetwork(channel, [EcuNode(0x7E0), EcuNode(0x7E1, profile=EcuProfile(silent=True))]) as net:
            ...
        net.ecus[1].requests     # what reached the silent one

    ``ecus``: the nodes, in the order given. Their request IDs must differ.
    Raises ValueError for two ECUs on one request ID, and whatever python-can
    raises when the bus cannot be opened.
    """

    def __init__(self, channel: str, ecus: Sequence[EcuNode], bus_type: str = "virtual",
                 bus_options: dict[str, Any] | None = None) -> None:
        ids = [node.request_id for node in ecus]
        if len(set(ids)) != len(ids):
            raise ValueError(f"two simulated ECUs share a request ID: {sorted(ids)}")
        super().__init__(bus_type, channel, ecus, bus_options)

    @property
    def ecus(self) -> list[EcuNode]:
        return self.nodes


def _int_auto(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r} (use 0x7E0 or 2016)") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run a simulated ECU as a process until SIGINT/SIGTERM or ``--duration`` seconds.

    Prints one JSON line ``{"event": "ready", ...}`` on stdout once the bus is
    open and one ``{"event": "stopped", "requests": N, ...}`` at the end.
    Returns 0, or 2 when the bus cannot be opened.
    """
    parser = argparse.ArgumentParser(prog="python -m canarchy.simulator",
                                     description="Simulated UDS ECU (ISO 14229-1 over ISO 15765-2).")
    parser.add_argument("--bus-type", default="virtual", help="python-can interface name (default: virtual)")
    parser.add_argument("--channel", required=True, help="channel to open (a multicast group for udp_multicast)")
    parser.add_argument("--request-id", type=_int_auto, default=0x7E0, help="request arbitration ID (0x7E0)")
    parser.add_argument("--response-id", type=_int_auto, default=None,
                        help="response arbitration ID (default: request ID + 8)")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--no-padding", action="store_true", help="send frames unpadded (DLC = used bytes)")
    args = parser.parse_args(argv)
    profile = EcuProfile(padding=None) if args.no_padding else EcuProfile()
    from canarchy.commands._common import StopSignals

    ecu = SimulatedEcu(bus_type=args.bus_type, channel=args.channel, request_id=args.request_id,
                       response_id=args.response_id, profile=profile)
    with StopSignals() as stop:
        try:
            try:
                ecu.start()
            except Exception as exc:
                print(json.dumps({"event": "error", "message": f"cannot open {args.bus_type} {args.channel}: {exc}"}),
                      flush=True)
                return 2
            print(json.dumps({"event": "ready", "bus_type": args.bus_type, "channel": args.channel,
                              "request_id": ecu.request_id, "response_id": ecu.response_id}), flush=True)
            deadline = None if args.duration is None else time.monotonic() + args.duration
            while stop.name is None and ecu.running:
                remaining = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if remaining <= 0:
                    break
                stop.wait(remaining)
        finally:
            ecu.stop()
    print(json.dumps({"event": "stopped", "requests": len(ecu.requests), "responses": len(ecu.responses),
                      "error": None if ecu.error is None else repr(ecu.error)}), flush=True)
    return 0 if ecu.error is None else 2


if __name__ == "__main__":
    sys.exit(main())
