"""A read-only local dashboard of a capture file: an HTML page, a JSON status route and a
live event stream, served with the standard library (``http.server``) from a thread.

Routes (``GET`` only; any other method is ``405`` with ``Allow: GET``; an unknown
path is ``404``; error bodies are canarchy envelopes with one error):

- ``GET /``: an HTML page rendered on the server (the capture's first
  :data:`PAGE_ROWS` frames, with the decoded message of each when a DBC is
  given, and a summary of every decoded signal) plus a small script that
  follows ``/api/events`` and prepends what arrives. Every value is escaped;
  the page's Content-Security-Policy allows exactly its own inline script and
  style (by SHA-256) and connections to this server.
- ``GET /api/status``: envelope, ``data``: ``file``, ``format``, ``dbc``,
  ``frame_count``, ``decoded_count`` (None without a DBC), ``message_count``,
  ``url``, ``started_at`` (Unix time), ``uptime_s``, ``requests``,
  ``streams_active``, ``speed``, ``event_limit``; ``warnings``: the capture's.
- ``GET /api/events[?limit=N&speed=X]``: Server-Sent Events (WHATWG HTML
  §9.2) replaying the capture: ``event: frame`` and ``event: decoded_message``,
  each ``data:`` a canarchy event ``{event_type, payload, source, timestamp}``
  (the payloads of ``capture --file`` and ``decode``), ``id:`` its number.
  Paced by the capture's own timestamps divided by ``speed`` (0: no pacing; a
  gap is never longer than :data:`MAX_GAP_S`), at most ``limit`` events (the
  stream is bounded), then ``event: end`` with ``{event_count, truncated,
  reason}`` (``end_of_capture``, ``limit`` or ``server_stopping``). At most
  ``max_streams`` streams at once (``503`` beyond).

Nothing here writes anything or opens a CAN bus. The capture is read once at
start (counts, the page's rows, the signal summary: bounded memory) and again
by each event stream, one frame at a time.

Binding (:func:`parse_bind`): ``HOST:PORT`` or ``[IPv6]:PORT``; port 0 asks the
OS for a free port (the real one is in :attr:`DashboardServer.url`). Only a
loopback host unless ``allow_remote``; when bound to loopback, a request whose
``Host`` header names another host is refused (``403``), which defeats DNS
rebinding. Errors: ``UserInputError`` ``WEB_BIND_INVALID`` (exit 1),
``TransportError`` ``WEB_BIND_FAILED`` (exit 2: the address is in use or cannot
be bound).
"""

from __future__ import annotations

import base64
import hashlib
import html
import ipaddress
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

from canarchy.errors import CanarchyError, TransportError, UserInputError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_BIND = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
#: Frames listed on the page.
PAGE_ROWS = 200
#: Events one ``/api/events`` stream sends by default, and at most.
DEFAULT_EVENT_LIMIT = 1000
MAX_EVENT_LIMIT = 100_000
#: Concurrent event streams.
DEFAULT_MAX_STREAMS = 8
#: The longest pause between two replayed events, in seconds (a recording may hold long silences).
MAX_GAP_S = 1.0
MAX_SPEED = 1000.0
ALLOW = "GET"


# --- binding ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bind:
    """Where to listen: ``host`` (an address, or a name with ``allow_remote``), ``port``
    (0 = any free port), ``family`` (``socket.AF_INET`` or ``AF_INET6``), ``loopback``."""

    host: str
    port: int
    family: int
    loopback: bool


def _bind_error(text: str, why: str) -> UserInputError:
    return UserInputError("WEB_BIND_INVALID", f"--bind {text!r}: {why}",
                          "Give HOST:PORT with a loopback host, e.g. 127.0.0.1:8765, [::1]:8765, or "
                          "127.0.0.1:0 for any free port; other hosts need --allow-remote.")


def parse_bind(text: str, allow_remote: bool = False) -> Bind:
    """Parse ``HOST:PORT`` / ``[IPV6]:PORT`` / ``:PORT`` (host 127.0.0.1).

    ``localhost`` means 127.0.0.1 (no name lookup). Port 0..65535. A host that
    is not a loopback address (127.0.0.0/8, ::1) is refused unless
    ``allow_remote``. Raises ``UserInputError`` ``WEB_BIND_INVALID``.
    """
    raw = text.strip()
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0 or raw[end + 1:end + 2] != ":":
            raise _bind_error(text, "an IPv6 address is written [ADDRESS]:PORT.")
        host, port_text = raw[1:end], raw[end + 2:]
    else:
        host, sep, port_text = raw.rpartition(":")
        if not sep:
            raise _bind_error(text, "expected HOST:PORT.")
        if ":" in host:
            raise _bind_error(text, "an IPv6 address is written in brackets, [::1]:PORT.")
    if not (port_text.isascii() and port_text.isdigit()):
        raise _bind_error(text, f"port {port_text!r} is not a number.")
    port = int(port_text)
    if port > 65535:
        raise _bind_error(text, f"port {port} is above 65535.")
    host = host or DEFAULT_HOST
    if host.lower() == "localhost":
        host = DEFAULT_HOST
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None:
        if not allow_remote:
            raise _bind_error(text, f"{host!r} is not a loopback address; the dashboard has no authentication.")
        if not all(c.isalnum() or c in "-." for c in host) or len(host) > 253:
            raise _bind_error(text, f"{host!r} is not a host name or address.")
        return Bind(host, port, socket.AF_INET, False)
    if not address.is_loopback and not allow_remote:
        raise _bind_error(text, f"{host} is not a loopback address; the dashboard has no authentication.")
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    return Bind(str(address), port, family, address.is_loopback)


# --- the data -------------------------------------------------------------------------------


class Dashboard:
    """What the routes show, read from a capture file (and a DBC) once at start.

    Attributes: ``file``, ``dbc``, ``format``, ``frame_count``,
    ``decoded_count`` (None without a DBC), ``rows`` (the first ``page_rows``
    frames: ``(frame payload, [decoded message names])``), ``summary`` (the
    DBC decoder's summary, or None), ``warnings``.

    Raises what :func:`canarchy.capture_file.open_capture` and
    :func:`canarchy.decode.dbc.load_dbc` raise (``CAPTURE_SOURCE_UNAVAILABLE``,
    ``CAPTURE_FORMAT_UNSUPPORTED``, ``DBC_NOT_FOUND``, ``DBC_LOAD_FAILED`` ...).
    """

    def __init__(self, file: str, dbc: str | None = None, page_rows: int = PAGE_ROWS) -> None:
        from canarchy.capture_file import open_capture

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
        self.rows: list[tuple[dict[str, Any], list[str]]] = []
        for frame in capture:
            decoded = decoder.feed(frame) if decoder is not None else []
            if len(self.rows) < page_rows:
                self.rows.append((frame.to_payload(), [d["message"] for d in decoded]))
        self.format = capture.format
        self.frame_count = capture.frame_count
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
                 event_limit: int = DEFAULT_EVENT_LIMIT, max_streams: int = DEFAULT_MAX_STREAMS) -> None:
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

    def start(self) -> "DashboardServer":
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

    def __enter__(self) -> "DashboardServer":
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


# --- the page ---------------------------------------------------------------------------------


_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; font: 12px/1.3 ui-monospace, monospace; }
th, td { border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } .meta { color: #555; } .num { text-align: right; }
"""

_SCRIPT = """
(function () {
  var body = document.getElementById("live-body");
  var status = document.getElementById("live-status");
  var count = 0;
  function hexId(p) {
    var s = p.arbitration_id.toString(16).toUpperCase();
    while (s.length < (p.is_extended_id ? 8 : 3)) { s = "0" + s; }
    return s;
  }
  function add(cells) {
    var tr = document.createElement("tr");
    cells.forEach(function (text) {
      var td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    });
    body.insertBefore(tr, body.firstChild);
    while (body.rows.length > 200) { body.deleteRow(-1); }
    count += 1;
    status.textContent = count + " events";
  }
  var source = new EventSource("/api/events");
  source.addEventListener("frame", function (e) {
    var p = JSON.parse(e.data).payload;
    add([p.timestamp.toFixed(6), "frame", hexId(p), String(p.dlc), p.data.toUpperCase()]);
  });
  source.addEventListener("decoded_message", function (e) {
    var p = JSON.parse(e.data).payload;
    var values = Object.keys(p.signals).map(function (name) {
      var s = p.signals[name];
      return name + "=" + s.value + (s.unit ? " " + s.unit : "");
    });
    add([p.timestamp.toFixed(6), p.message, "0x" + p.arbitration_id.toString(16).toUpperCase(), "",
         values.join("  ")]);
  });
  source.addEventListener("end", function (e) {
    var info = JSON.parse(e.data);
    status.textContent = count + " events; replay ended (" + info.reason + ")";
    source.close();
  });
  source.onerror = function () {
    status.textContent = count + " events; the stream closed";
    source.close();
  };
})();
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


#: The page's Content-Security-Policy: its own inline script and style, connections to this origin.
CONTENT_SECURITY_POLICY = (f"default-src 'none'; script-src {_sha256(_SCRIPT)}; style-src {_sha256(_STYLE)}; "
                           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


def render_page(server: DashboardServer) -> str:
    """The dashboard's HTML (every capture and DBC value escaped)."""
    d = server.dashboard
    decoded = "" if d.decoded_count is None else f", {d.decoded_count} decoded messages with {_e(d.dbc)}"
    parts = [
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>canarchy: {_e(d.file)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>canarchy web: {_e(d.file)}</h1>",
        f"<p class=\"meta\" id=\"summary\">{d.frame_count} frames ({_e(d.format)}){decoded}. "
        f"Read-only; status as JSON at <a href=\"/api/status\">/api/status</a>, "
        f"events at <a href=\"/api/events\">/api/events</a>.</p>",
    ]
    if d.warnings:
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{_e(w)}</li>" for w in d.warnings) + "</ul>")
    if d.summary is not None:
        parts.append("<h2>Decoded signals</h2><table id=\"signals\"><thead><tr><th>message</th><th>ID</th>"
                     "<th class=\"num\">count</th><th>signal</th><th class=\"num\">min</th><th class=\"num\">max</th>"
                     "<th class=\"num\">last</th><th>unit</th></tr></thead><tbody>")
        for name, message in d.summary["messages"].items():
            for signal_name, s in message["signals"].items():
                parts.append(f"<tr><td>{_e(name)}</td><td>0x{message['arbitration_id']:X}</td>"
                             f"<td class=\"num\">{s['count']}</td><td>{_e(signal_name)}</td>"
                             f"<td class=\"num\">{_e(_number(s['min']))}</td><td class=\"num\">{_e(_number(s['max']))}</td>"
                             f"<td class=\"num\">{_e(_number(s['last']))}</td><td>{_e(s['unit'])}</td></tr>")
        parts.append("</tbody></table>")
    shown = len(d.rows)
    parts.append(f"<h2>Frames</h2><p class=\"meta\">the first {shown} of {d.frame_count}</p>"
                 "<table id=\"frames\"><thead><tr><th>time</th><th>channel</th><th>ID</th><th class=\"num\">DLC</th>"
                 "<th>data</th><th>decoded</th></tr></thead><tbody>")
    for frame, messages in d.rows:
        width = 8 if frame["is_extended_id"] else 3
        parts.append(f"<tr><td>{frame['timestamp']:.6f}</td><td>{_e(frame['channel'])}</td>"
                     f"<td>{frame['arbitration_id']:0{width}X}</td><td class=\"num\">{frame['dlc']}</td>"
                     f"<td>{_e(frame['data'].upper())}</td><td>{_e(' '.join(messages))}</td></tr>")
    parts.append("</tbody></table>")
    parts.append("<h2>Live</h2><p class=\"meta\" id=\"live-status\">connecting to /api/events ...</p>"
                 "<table><thead><tr><th>time</th><th>event</th><th>ID</th><th class=\"num\">DLC</th><th>data</th>"
                 f"</tr></thead><tbody id=\"live-body\"></tbody></table><script>{_SCRIPT}</script></body></html>\n")
    return "".join(parts)


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
        route = {"/": self._page, "/api/status": self._status, "/api/events": self._events}.get(parts.path)
        if route is None:
            self._error(404, "WEB_ROUTE_NOT_FOUND", f"No route {parts.path!r}.",
                        "The routes are / (the page), /api/status and /api/events.")
            return
        route(parse_qs(parts.query, keep_blank_values=True))

    def _page(self, query: dict[str, list[str]]) -> None:
        body = render_page(self.server).encode("utf-8")
        self._send(200, body, "text/html; charset=utf-8",
                   {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Referrer-Policy": "no-referrer"})

    def _status(self, query: dict[str, list[str]]) -> None:
        body = _envelope("web status", self.server.status(), self.server.dashboard.warnings)
        self._send(200, body, "application/json")

    def _query_number(self, query: dict[str, list[str]], name: str, default: float, lo: float, hi: float,
                      integer: bool) -> float | None:
        values = query.get(name)
        if not values:
            return default
        try:
            value = int(values[-1]) if integer else float(values[-1])
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            kind = "a whole number" if integer else "a number"
            self._error(400, "WEB_QUERY_INVALID", f"{name}={values[-1]!r} is not {kind} in {lo:g}..{hi:g}.",
                        f"e.g. /api/events?limit={DEFAULT_EVENT_LIMIT}&speed=1 (speed 0: no pacing).")
            return None
        return value

    def _events(self, query: dict[str, list[str]]) -> None:
        server = self.server
        limit = self._query_number(query, "limit", server.event_limit, 1, MAX_EVENT_LIMIT, True)
        if limit is None:
            return
        speed = self._query_number(query, "speed", server.speed, 0, MAX_SPEED, False)
        if speed is None:
            return
        if not server._streams.acquire(blocking=False):
            self._error(503, "WEB_TOO_MANY_STREAMS", "Too many event streams are open.",
                        "Close another tab that follows the dashboard, then retry.", {"Retry-After": "5"})
            return
        with server._lock:
            server.streams_active += 1
            server.streams_served += 1
        try:
            self._stream(int(limit), float(speed))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the client went away: nothing to tell it
        finally:
            with server._lock:
                server.streams_active -= 1
            server._streams.release()

    def _stream(self, limit: int, speed: float) -> None:
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
                if sent >= limit:
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
        self.wfile.write(f"{head}event: {name}\ndata: {json.dumps(data, sort_keys=True)}\n\n".encode("utf-8"))
