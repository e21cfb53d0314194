"""A read-only local dashboard of a capture file, served with ``http.server`` from a thread.

Routes (``GET`` only): ``/``, ``/signal``, ``/plot.svg``, ``/api/status``, ``/api/ids``, ``/api/events``
(Server-Sent Events replaying the recording, paced by its timestamps); error bodies are canarchy envelopes.
Streams and plots read the capture one frame at a time, so memory does not grow with it. Loopback only
unless ``allow_remote``. Errors: ``WEB_BIND_INVALID`` (exit 1), ``WEB_BIND_FAILED`` (exit 2). Details:
``docs/web.md``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

from canarchy.errors import CanarchyError, TransportError
from canarchy.web_bind import Bind
from canarchy.web_render import CONTENT_SECURITY_POLICY, render_page, render_plot, render_signal_page

#: Frames listed on the page.
PAGE_ROWS = 200
#: Events one ``/api/events`` stream sends by default (None: the whole recording), and the largest ``limit``.
DEFAULT_EVENT_LIMIT: int | None = None
MAX_EVENT_LIMIT = 10_000_000
#: Concurrent event streams.
DEFAULT_MAX_STREAMS = 8
#: The longest pause between two replayed events, in seconds (a recording may hold long silences).
MAX_GAP_S = 1.0
MAX_SPEED = 1000.0
ALLOW = "GET"


# --- the data -------------------------------------------------------------------------------


class Dashboard:
    """What the routes show, read from a capture file (and a DBC) once at start, in bounded memory.

    Attributes: ``file``, ``dbc``, ``format``, ``frame_count``, ``start``
    (timestamp of the first frame: page times are relative to it), ``stats``
    (:class:`canarchy.capture_stats.CaptureStats`: per-ID counts and rates),
    ``decoded_count`` (None without a DBC), ``rows`` (the first
    ``page_rows`` frames: ``(frame payload, [decoded message names])``),
    ``summary`` (the DBC decoder's summary, or None), ``message_ids``
    (message name -> the ``(arbitration ID, 29-bit)`` pairs it was decoded from), ``id_messages`` (the
    reverse), ``warnings``.

    Raises what :func:`canarchy.capture_file.open_capture` and
    :func:`canarchy.decode.dbc.load_dbc` raise (``CAPTURE_SOURCE_UNAVAILABLE``,
    ``CAPTURE_FORMAT_UNSUPPORTED``, ``DBC_NOT_FOUND``, ``DBC_LOAD_FAILED`` ...).
    """

    def __init__(self, file: str, dbc: str | None = None, page_rows: int = PAGE_ROWS) -> None:
        from canarchy.capture_file import open_capture
        from canarchy.capture_stats import CaptureStats

        self.file = file
        self.dbc = dbc
        capture = open_capture(file)
        self._database = None
        warnings: list[str] = []
        if dbc is not None:
            from canarchy.decode.dbc import load_dbc

            self._database, dbc_warnings = load_dbc(dbc)
            warnings += dbc_warnings.render()
        decoder = self._decoder()
        self.stats = CaptureStats()
        self.rows: list[tuple[dict[str, Any], list[str]]] = []
        self.message_ids: dict[str, set[tuple[int, bool]]] = {}
        self.id_messages: dict[tuple[int, bool], set[str]] = {}
        for frame in capture:
            self.stats.feed(frame)
            decoded = decoder.feed(frame) if decoder is not None else []
            for payload in decoded:
                key = (payload["arbitration_id"], payload["is_extended_id"])
                self.message_ids.setdefault(payload["message"], set()).add(key)
                self.id_messages.setdefault(key, set()).add(payload["message"])
            if len(self.rows) < page_rows:
                self.rows.append((frame.to_payload(), [d["message"] for d in decoded]))
        self.format = capture.format
        self.frame_count = capture.frame_count
        self.start = self.stats.start or 0.0
        self.summary = None
        self.decoded_count = None
        if decoder is not None:
            decoder.finish()
            self.summary = decoder.summary()
            self.decoded_count = decoder.decoded_count
            warnings += decoder.warnings.render()
        self.warnings = capture.all_warnings() + warnings

    def _decoder(self) -> Any:
        if self._database is None:
            return None
        from canarchy.decode.dbc import DbcDecoder

        return DbcDecoder(self._database)

    def events(self) -> Iterator[dict[str, Any]]:
        """Replay the capture as canarchy events: ``frame``, then the ``decoded_message`` it completes."""
        from canarchy.capture_file import open_capture
        from canarchy.output import make_event

        decoder = self._decoder()
        source = f"file:{self.file}"
        for frame in open_capture(self.file):
            yield make_event("frame", frame.to_payload(), source, frame.timestamp)
            if decoder is not None:
                for payload in decoder.feed(frame):
                    yield make_event("decoded_message", payload, source, payload["timestamp"])

    def signal(self, message: str, signal: str) -> dict[str, Any] | None:
        """The summary of one decoded signal (``count``, ``min``, ``max``, ``last``, ``unit``), or None."""
        if self.summary is None:
            return None
        return (self.summary["messages"].get(message) or {}).get("signals", {}).get(signal)

    def series(self, message: str, signal: str) -> Iterator[tuple[float, float]]:
        """``(timestamp, value)`` of every numeric value of ``message.signal``, read from the file again."""
        from canarchy.capture_file import open_capture

        decoder = self._decoder()
        if decoder is None:
            return
        for frame in open_capture(self.file):
            for payload in decoder.feed(frame):
                if payload["message"] != message:
                    continue
                value = (payload["signals"].get(signal) or {}).get("value")
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    yield payload["timestamp"], float(value)


# --- the server -------------------------------------------------------------------------------


class DashboardServer(ThreadingHTTPServer):
    """The HTTP server: :meth:`start` serves from a background thread, :meth:`stop` ends
    the open event streams and closes the socket. ``url`` is the real address
    (with the port the OS chose for port 0).

    Raises ``TransportError`` ``WEB_BIND_FAILED`` when the address cannot be bound.
    """

    daemon_threads = True
    allow_reuse_address = True  # a restarted dashboard may take its port back at once (TIME_WAIT)

    def __init__(self, bind: Bind, dashboard: Dashboard, speed: float = 1.0,
                 event_limit: int | None = DEFAULT_EVENT_LIMIT, max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        self.address_family = bind.family
        self.bind = bind
        self.dashboard = dashboard
        self.speed = speed
        self.event_limit = event_limit
        self.stopping = threading.Event()
        self.requests = 0
        self.streams_served = 0
        self.streams_active = 0
        self._streams = threading.BoundedSemaphore(max_streams)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.started_at = time.time()
        self._started = time.monotonic()
        try:
            super().__init__((bind.host, bind.port), _Handler)
        except OSError as exc:
            raise TransportError(
                "WEB_BIND_FAILED",
                f"Cannot listen on {_authority(bind.host, bind.port)}: {exc.strerror or exc}.",
                "Choose another port with --bind HOST:PORT (port 0 picks a free one), "
                "or stop the program that holds this one.",
            ) from None
        host, port = self.server_address[:2]
        self.url = f"http://{_authority(host, port)}/"
        self._allowed_hosts = _allowed_hosts(bind, port)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would call socket.getfqdn(host): a name lookup that may
        # leave the machine. The dashboard needs no server name.
        import socketserver

        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    @property
    def uptime(self) -> float:
        return time.monotonic() - self._started

    def start(self) -> DashboardServer:
        """Serve in a background thread. Idempotent."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"canarchy-web-{self.server_address[1]}", daemon=True)
            self._thread.start()
        return self

    def stop(self, grace: float = 2.0) -> None:
        """End the event streams (each sends ``end`` with ``server_stopping``), wait up to
        ``grace`` seconds for them, stop serving and close the socket. Idempotent."""
        self.stopping.set()
        deadline = time.monotonic() + grace
        while self.streams_active and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def host_allowed(self, header: str | None) -> bool:
        """True when the ``Host`` header names this server (always, when bound beyond loopback)."""
        if self._allowed_hosts is None or header is None:
            return True
        return header.strip().lower() in self._allowed_hosts

    def count_request(self) -> None:
        with self._lock:
            self.requests += 1

    def status(self) -> dict[str, Any]:
        d = self.dashboard
        return {
            "file": d.file,
            "format": d.format,
            "dbc": d.dbc,
            "frame_count": d.frame_count,
            "decoded_count": d.decoded_count,
            "message_count": None if d.summary is None else len(d.summary["messages"]),
            "url": self.url,
            "started_at": self.started_at,
            "uptime_s": round(self.uptime, 3),
            "requests": self.requests,
            "streams_active": self.streams_active,
            "speed": self.speed,
            "event_limit": self.event_limit,
        }


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _allowed_hosts(bind: Bind, port: int) -> frozenset[str] | None:
    if not bind.loopback:
        return None
    names = {"localhost", "127.0.0.1", "[::1]", _authority(bind.host, port).rsplit(":", 1)[0]}
    return frozenset(n for name in names for n in (name, f"{name}:{port}"))


# --- the handler ------------------------------------------------------------------------------


def _envelope(command: str, data: dict[str, Any], warnings: list[str] | None = None,
              error: dict[str, str] | None = None) -> bytes:
    body = {"ok": error is None, "command": command, "data": data, "warnings": warnings or [],
            "errors": [] if error is None else [error]}
    return (json.dumps(body, sort_keys=True) + "\n").encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "canarchy-web"
    sys_version = ""
    protocol_version = "HTTP/1.0"  # every response closes its connection: an event stream ends with it
    timeout = 30  # seconds a client may stall a read or a write

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log on stderr: stdout and stderr belong to the command's own output

    def __getattr__(self, name: str) -> Any:
        # Any method but GET (POST, PUT, HEAD, BREW ...) is answered 405, not 501.
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    # -- responses --

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, hint: str, headers: dict[str, str] | None = None) -> None:
        body = _envelope("web serve", {"status": status, "path": self.path}, None,
                         {"code": code, "message": message, "hint": hint})
        self._send(status, body, "application/json", headers)

    def _not_allowed(self) -> None:
        self.server.count_request()
        self._error(405, "WEB_METHOD_NOT_ALLOWED", f"{self.command} is not allowed: the dashboard is read-only.",
                    "Use GET.", {"Allow": ALLOW})

    # -- routes --

    def do_GET(self) -> None:
        self.server.count_request()
        if not self.server.host_allowed(self.headers.get("Host")):
            self._error(403, "WEB_HOST_REJECTED", f"Host {self.headers.get('Host')!r} is not this dashboard.",
                        f"Open {self.server.url} (a page under another name may be a DNS rebinding attempt).")
            return
        parts = urlsplit(self.path)
        route = {"/": self._page, "/signal": self._signal_page, "/plot.svg": self._plot, "/api/status": self._status,
                 "/api/ids": self._ids, "/api/events": self._events}.get(parts.path)
        if route is None:
            self._error(404, "WEB_ROUTE_NOT_FOUND", f"No route {parts.path!r}.",
                        "The routes are / (the page), /signal and /plot.svg (?message=M&signal=S), /api/status, "
                        "/api/ids and /api/events.")
            return
        route(parse_qs(parts.query, keep_blank_values=True))

    def _page(self, query: dict[str, list[str]]) -> None:
        body = render_page(self.server).encode("utf-8")
        self._send(200, body, "text/html; charset=utf-8",
                   {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Referrer-Policy": "no-referrer"})

    def _signal_query(self, query: dict[str, list[str]]) -> tuple[str, str] | None:
        message, signal = (query.get(name, [""])[-1] for name in ("message", "signal"))
        if not message or not signal:
            self._error(400, "WEB_QUERY_INVALID", "A plot needs ?message=M&signal=S.",
                        "Follow a plot link of the page's Decoded signals table.")
            return None
        if self.server.dashboard.signal(message, signal) is None:
            hint = ("Start the dashboard with --dbc to decode signals." if self.server.dashboard.dbc is None
                    else "Pick a signal of the page's Decoded signals table (names are case-sensitive).")
            self._error(404, "WEB_SIGNAL_NOT_FOUND", f"No decoded signal {message}.{signal}.", hint)
            return None
        return message, signal

    def _signal_page(self, query: dict[str, list[str]]) -> None:
        chosen = self._signal_query(query)
        if chosen is None:
            return
        body = render_signal_page(self.server, *chosen).encode("utf-8")
        self._send(200, body, "text/html; charset=utf-8",
                   {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Referrer-Policy": "no-referrer"})

    def _plot(self, query: dict[str, list[str]]) -> None:
        chosen = self._signal_query(query)
        if chosen is None:
            return
        body = render_plot(self.server.dashboard, *chosen).encode("utf-8")
        self._send(200, body, "image/svg+xml; charset=utf-8", {"Content-Security-Policy": "default-src 'none'"})

    def _ids(self, query: dict[str, list[str]]) -> None:
        d = self.server.dashboard
        data = dict(d.stats.to_dict(), file=d.file, format=d.format)
        self._send(200, _envelope("web ids", data, d.warnings), "application/json")

    def _status(self, query: dict[str, list[str]]) -> None:
        body = _envelope("web status", self.server.status(), self.server.dashboard.warnings)
        self._send(200, body, "application/json")

    def _query_number(self, query: dict[str, list[str]], name: str, default: float | None, lo: float, hi: float,
                      integer: bool) -> tuple[bool, float | None]:
        """``(True, value)`` (``default`` when absent), or ``(False, None)`` after a 400 answer."""
        values = query.get(name)
        if not values:
            return True, default
        try:
            value = int(values[-1]) if integer else float(values[-1])
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            kind = "a whole number" if integer else "a number"
            self._error(400, "WEB_QUERY_INVALID", f"{name}={values[-1]!r} is not {kind} in {lo:g}..{hi:g}.",
                        "e.g. /api/events?limit=1000&speed=1 (speed 0: no pacing; no limit: the whole recording).")
            return False, None
        return True, value

    def _events(self, query: dict[str, list[str]]) -> None:
        server = self.server
        ok, limit = self._query_number(query, "limit", server.event_limit, 1, MAX_EVENT_LIMIT, True)
        if not ok:
            return
        ok, speed = self._query_number(query, "speed", server.speed, 0, MAX_SPEED, False)
        if not ok:
            return
        if not server._streams.acquire(blocking=False):
            self._error(503, "WEB_TOO_MANY_STREAMS", "Too many event streams are open.",
                        "Close another tab that follows the dashboard, then retry.", {"Retry-After": "5"})
            return
        with server._lock:
            server.streams_active += 1
            server.streams_served += 1
        try:
            self._stream(None if limit is None else int(limit), float(speed))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the client went away: nothing to tell it
        finally:
            with server._lock:
                server.streams_active -= 1
            server._streams.release()

    def _stream(self, limit: int | None, speed: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        stopping = self.server.stopping
        sent = 0
        reason = "end_of_capture"
        previous: float | None = None
        events = self.server.dashboard.events()
        try:
            for event in events:
                if stopping.is_set():
                    reason = "server_stopping"
                    break
                if limit is not None and sent >= limit:
                    reason = "limit"
                    break
                if speed > 0 and event["event_type"] == "frame":
                    stamp = event["timestamp"]
                    if previous is not None and stamp > previous and stopping.wait(min((stamp - previous) / speed,
                                                                                       MAX_GAP_S)):
                        reason = "server_stopping"
                        break
                    previous = stamp
                sent += 1
                self._write_event(event["event_type"], event, sent)
        except CanarchyError as exc:  # e.g. the capture file was removed after start
            self._write_event("error", exc.to_dict(), None)
            reason = "error"
        finally:
            events.close()
        self._write_event("end", {"event_count": sent, "truncated": reason == "limit", "reason": reason}, None)

    def _write_event(self, name: str, data: dict[str, Any], event_id: int | None) -> None:
        head = f"id: {event_id}\n" if event_id is not None else ""
        self.wfile.write(f"{head}event: {name}\ndata: {json.dumps(data, sort_keys=True)}\n\n".encode())
