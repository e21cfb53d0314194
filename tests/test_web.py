"""``web serve``: the read-only dashboard, exercised with a real HTTP client over loopback.

Each server listens on 127.0.0.1 port 0 (a free port the OS picks) and serves
from a thread (``canarchy.web.DashboardServer``), or, for the command and its
signals, from the command's handler in a thread or a subprocess. The data are
the real fixture captures; expected values are computed here from the log text.
Only loopback traffic.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import base64
import hashlib
import http.client
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from canarchy import web
from canarchy.cli import main
from canarchy.commands import web as web_command
from tests.helpers import run_cli

CAPTURES = Path(__file__).parent.parent / "fixtures" / "captures"
TRUCK = str(CAPTURES / "j1939_truck_idle.log")
TRUCK_DBC = str(CAPTURES / "css_j1939_demo.dbc")
LEAF = str(CAPTURES / "nissan_leaf_uds_79b_7bb.log")
LEAF_DBC = str(CAPTURES / "css_tp_uds_nissan_leaf.dbc")
OBD = str(CAPTURES / "obd2_skoda_7e0_7e8.log")


def log_frames(path: str) -> list[tuple[float, int, str]]:
    """``(timestamp, arbitration ID, data hex)`` of every line of a candump log, read here."""
    frames = []
    for line in Path(path).read_text().splitlines():
        stamp, _channel, body = line.split()
        ident, data = body.split("#")
        frames.append((float(stamp[1:-1]), int(ident, 16), data.lower()))
    return frames


@pytest.fixture
def serve():
    """``serve(file, dbc=None, **options)`` -> a started DashboardServer on 127.0.0.1:0; stopped afterwards."""
    servers = []

    def start(file: str, dbc: str | None = None, **options) -> web.DashboardServer:
        server = web.DashboardServer(web.parse_bind("127.0.0.1:0"), web.Dashboard(file, dbc), **options)
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


def get(url: str, **headers) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def sse(body: bytes) -> list[tuple[str, dict]]:
    """Parse a Server-Sent Events body into ``(event name, data)`` pairs."""
    events = []
    for block in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


# -- the routes ---------------------------------------------------------------------------------

def test_status_reports_the_capture(serve):
    server = serve(TRUCK, TRUCK_DBC)
    decoded = run_cli("decode", "--file", TRUCK, "--dbc", TRUCK_DBC, "--summary", "--json").data["decoded_count"]
    status, headers, body = get(server.url + "api/status")
    assert status == 200 and headers["Content-Type"] == "application/json"
    envelope = json.loads(body)
    assert (envelope["ok"], envelope["command"]) == (True, "web status")
    data = envelope["data"]
    assert (data["file"], data["dbc"], data["format"]) == (TRUCK, TRUCK_DBC, "candump")
    assert data["frame_count"] == len(log_frames(TRUCK)) == 3582
    assert data["decoded_count"] == decoded == 1100 and data["message_count"] == 2
    assert data["url"] == server.url and re.fullmatch(r"http://127\.0\.0\.1:\d+/", server.url)
    time.sleep(0.05)
    assert json.loads(get(server.url + "api/status")[2])["data"]["uptime_s"] > data["uptime_s"]


def test_status_without_a_dbc(serve):
    data = json.loads(get(serve(OBD).url + "api/status")[2])["data"]
    assert (data["frame_count"], data["decoded_count"], data["message_count"], data["dbc"]) == (3854, None, None, None)


def test_the_page_lists_frames_and_decoded_signals(serve):
    server = serve(TRUCK, TRUCK_DBC)
    status, headers, body = get(server.url)
    page = body.decode()
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "3582 frames (candump), 1100 decoded messages" in page
    first = log_frames(TRUCK)[:web.PAGE_ROWS]
    rows = re.findall(r"<tr><td>([\d.]+)</td><td>can0</td><td>([0-9A-F]+)</td><td class=\"num\">8</td>"
                      r"<td>([0-9A-F]+)</td><td>([^<]*)</td></tr>", page)
    assert [(float(t), int(i, 16), d.lower()) for t, i, d, _ in rows] == [(round(t, 6), i, d) for t, i, d in first]
    assert rows[2][1:] == ("0CF00400", "607D84481400F084", "EEC1")  # EEC1 decoded by PGN
    # the signal summary: EEC1 engine speed over the whole capture
    assert re.search(r"<td>EEC1</td><td>0xCF004FE</td><td class=\"num\">1000</td><td>EngineSpeed</td>"
                     r"<td class=\"num\">646.75</td><td class=\"num\">653.75</td>", page)


def test_the_page_follows_the_event_stream_under_a_strict_policy(serve):
    _status, headers, body = get(serve(LEAF, LEAF_DBC).url)
    page = body.decode()
    policy = headers["Content-Security-Policy"]
    script = re.search(r"<script>(.*)</script>", page, re.S).group(1)
    style = re.search(r"<style>(.*)</style>", page, re.S).group(1)
    for text, directive in ((script, "script-src"), (style, "style-src")):
        digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        assert f"{directive} 'sha256-{digest}'" in policy
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert 'new EventSource("/api/events")' in script and "textContent" in script and "innerHTML" not in script


def test_capture_values_are_escaped_on_the_page(serve, tmp_path):
    hostile = tmp_path / "hostile.log"
    hostile.write_text("(1.000000) <img/src=x> 123#0102\n")
    page = get(serve(str(hostile)).url)[2].decode()
    assert "<img" not in page and "&lt;img/src=x&gt;" in page


def test_events_replay_the_capture_in_order(serve):
    server = serve(LEAF, LEAF_DBC)
    status, headers, body = get(server.url + "api/events?speed=0")
    assert status == 200 and headers["Content-Type"] == "text/event-stream; charset=utf-8"
    events = sse(body)
    name, end = events.pop()
    assert name == "end" and end == {"event_count": 247, "truncated": False, "reason": "end_of_capture"}
    frames = [data["payload"] for kind, data in events if kind == "frame"]
    decoded = [data["payload"] for kind, data in events if kind == "decoded_message"]
    assert [(f["timestamp"], f["arbitration_id"], f["data"]) for f in frames] == log_frames(LEAF)
    assert len(decoded) == 26
    # the same decoded messages as `decode` gives
    assert decoded == [e["payload"] for e in run_cli("decode", "--file", LEAF, "--dbc", LEAF_DBC,
                                                     "--json").data["events"]]
    soc = [round(d["signals"]["SoC"]["value"], 4) for d in decoded if "SoC" in d["signals"]]
    assert soc[:2] == [89.2286, 89.2184]
    assert all(data["source"] == f"file:{LEAF}" for _kind, data in events)


def test_events_are_bounded(serve):
    server = serve(TRUCK, TRUCK_DBC, event_limit=5)
    events = sse(get(server.url + "api/events?speed=0")[2])
    assert [kind for kind, _ in events] == ["frame", "frame", "frame", "decoded_message", "frame", "end"]
    assert events[-1][1] == {"event_count": 5, "truncated": True, "reason": "limit"}
    assert len(sse(get(server.url + "api/events?speed=0&limit=2")[2])) == 3


def test_events_are_paced_by_the_capture_timestamps(serve):
    server = serve(OBD)
    (t0, *_), (t1, *_), (t2, *_) = log_frames(OBD)[:3]  # 5.8 ms, then 194 ms apart
    started = time.monotonic()
    events = sse(get(server.url + "api/events?limit=3&speed=1")[2])
    elapsed = time.monotonic() - started
    assert len(events) == 4
    assert elapsed >= t2 - t0 - 0.01  # paced: at least the recorded gaps


@pytest.mark.parametrize("query", ["limit=0", "limit=x", f"limit={web.MAX_EVENT_LIMIT + 1}", "speed=-1",
                                   "speed=fast", "speed=nan"])
def test_bad_event_queries(serve, query):
    status, _headers, body = get(serve(OBD).url + "api/events?" + query)
    assert status == 400 and json.loads(body)["errors"][0]["code"] == "WEB_QUERY_INVALID"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW"])
def test_only_get_is_allowed(serve, method):
    server = serve(OBD)
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    try:
        connection.request(method, "/api/status", body=b"{}" if method in ("POST", "PUT", "PATCH") else None)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    assert (response.status, response.getheader("Allow")) == (405, "GET")
    assert json.loads(body)["errors"][0]["code"] == "WEB_METHOD_NOT_ALLOWED"


def test_head_is_refused_without_a_body(serve):
    server = serve(OBD)
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    try:
        connection.request("HEAD", "/")
        response = connection.getresponse()
        assert (response.status, response.getheader("Allow"), response.read()) == (405, "GET", b"")
    finally:
        connection.close()


@pytest.mark.parametrize("path", ["/nope", "/api", "/api/status/", "/index.html", "/api/events/x"])
def test_unknown_routes_are_404_json(serve, path):
    status, headers, body = get(serve(OBD).url.rstrip("/") + path)
    assert status == 404 and headers["Content-Type"] == "application/json"
    envelope = json.loads(body)
    assert envelope["ok"] is False and envelope["errors"][0]["code"] == "WEB_ROUTE_NOT_FOUND"
    assert envelope["errors"][0]["hint"]


def test_a_foreign_host_header_is_refused(serve):
    server = serve(OBD)
    status, _headers, body = get(server.url + "api/status", Host="attacker.example:80")
    assert status == 403 and json.loads(body)["errors"][0]["code"] == "WEB_HOST_REJECTED"
    port = server.server_address[1]
    assert get(server.url + "api/status", Host=f"localhost:{port}")[0] == 200


def test_too_many_streams(serve):
    server = serve(OBD, max_streams=1)
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    try:
        connection.request("GET", "/api/events?speed=0.001")  # a slow stream that holds the one slot
        response = connection.getresponse()
        assert response.status == 200 and response.readline().startswith(b"id: 1")
        status, headers, body = get(server.url + "api/events")
        assert (status, headers["Retry-After"]) == (503, "5")
        assert json.loads(body)["errors"][0]["code"] == "WEB_TOO_MANY_STREAMS"
    finally:
        connection.close()


def test_stopping_the_server_ends_open_streams(serve):
    server = serve(OBD, speed=0.001)
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    try:
        connection.request("GET", "/api/events")
        response = connection.getresponse()
        assert response.readline().startswith(b"id: 1")
        server.stop()
        rest = response.read()
    finally:
        connection.close()
    assert sse(rest)[-1] == ("end", {"event_count": 1, "truncated": False, "reason": "server_stopping"})


def test_a_client_that_goes_away_does_not_hurt_the_server(serve):
    server = serve(TRUCK, speed=0)
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as raw:
        raw.sendall(b"GET /api/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        raw.recv(100)
    deadline = time.monotonic() + 2
    while server.streams_active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.streams_active == 0
    assert get(server.url + "api/status")[0] == 200


# -- binding ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:0", ("127.0.0.1", 0, socket.AF_INET, True)),
    ("localhost:8080", ("127.0.0.1", 8080, socket.AF_INET, True)),
    (":65535", ("127.0.0.1", 65535, socket.AF_INET, True)),
    ("127.1.2.3:80", ("127.1.2.3", 80, socket.AF_INET, True)),
    ("[::1]:8765", ("::1", 8765, socket.AF_INET6, True)),
])
def test_parse_bind(text, expected):
    bind = web.parse_bind(text)
    assert (bind.host, bind.port, bind.family, bind.loopback) == expected


def test_remote_hosts_need_allow_remote():
    bind = web.parse_bind("0.0.0.0:8765", allow_remote=True)
    assert (bind.host, bind.loopback) == ("0.0.0.0", False)
    assert web.parse_bind("dashboard.lan:80", allow_remote=True).host == "dashboard.lan"


@pytest.mark.parametrize("text", ["127.0.0.1:notaport", "127.0.0.1:65536", "127.0.0.1", "127.0.0.1:-1",
                                  "10.0.0.1:8765", "0.0.0.0:8765", "[::]:8765", "example.com:80", "::1:8765",
                                  "[::1]8765", "127.0.0.1:٣"])
def test_bad_binds_are_refused_before_reading_anything(text):
    result = run_cli("web", "serve", "--file", "missing.log", "--bind", text, "--json")
    assert (result.code, result.error_codes) == (1, ["WEB_BIND_INVALID"])


def test_a_port_in_use_is_a_transport_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("web", "serve", "--file", OBD, "--bind", f"127.0.0.1:{port}", "--json")
    assert (result.code, result.error_codes) == (2, ["WEB_BIND_FAILED"])
    assert str(port) in result.envelope["errors"][0]["message"]


@pytest.mark.parametrize("argv,code,exit_code", [
    (["--file", "missing.log"], "CAPTURE_SOURCE_UNAVAILABLE", 2),
    (["--file", OBD, "--dbc", "missing.dbc"], "DBC_NOT_FOUND", 1),
    (["--file", OBD + ".txt"], "CAPTURE_SOURCE_UNAVAILABLE", 2),
    (["--file", OBD, "--speed", "-1"], "INVALID_ARGUMENTS", 1),
    (["--file", OBD, "--event-limit", "0"], "INVALID_ARGUMENTS", 1),
    (["--file", OBD, "--duration", "0"], "INVALID_ARGUMENTS", 1),
    (["--dbc", TRUCK_DBC], "INVALID_ARGUMENTS", 1),
])
def test_command_errors(argv, code, exit_code):
    result = run_cli("web", "serve", "--bind", "127.0.0.1:0", *argv, "--json")
    assert (result.code, result.error_codes) == (exit_code, [code])


def test_help_defaults_match_the_server():
    assert web_command.HELP_DEFAULTS == {"bind": web.DEFAULT_BIND, "event_limit": web.DEFAULT_EVENT_LIMIT,
                                         "max_event_limit": web.MAX_EVENT_LIMIT}
    assert web.DEFAULT_BIND == "127.0.0.1:8765"


# -- the command --------------------------------------------------------------------------------

class UrlStream(io.StringIO):
    """stdout for the command in a thread: ``url`` is set from its ``web_listening`` line."""

    def __init__(self) -> None:
        super().__init__()
        self.listening = threading.Event()
        self.url = None

    def write(self, text: str) -> int:
        if '"web_listening"' in text:
            self.url = json.loads(text)["payload"]["url"]
            self.listening.set()
        return super().write(text)


def test_the_command_serves_until_its_duration():
    out = UrlStream()
    codes = []
    thread = threading.Thread(target=lambda: codes.append(main(
        ["web", "serve", "--file", LEAF, "--dbc", LEAF_DBC, "--bind", "127.0.0.1:0", "--duration", "0.6",
         "--jsonl"], stdout=out)))
    thread.start()
    try:
        assert out.listening.wait(5), out.getvalue()
        assert json.loads(get(out.url + "api/status")[2])["data"]["decoded_count"] == 26
        assert len(sse(get(out.url + "api/events?speed=0&limit=3")[2])) == 4
    finally:
        thread.join(5)
    assert codes == [0]
    envelope = json.loads(out.getvalue().splitlines()[-1])
    data = envelope["data"]
    assert (data["stopped_by"], data["requests"], data["streams_served"], data["url"]) == ("duration", 2, 1, out.url)
    assert (data["frame_count"], data["decoded_count"]) == (221, 26)
    with pytest.raises(OSError):  # the port is closed
        socket.create_connection(("127.0.0.1", data["port"]), timeout=1).close()


def _start(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "canarchy", "web", "serve", *argv, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))


def test_sigterm_and_sigint_stop_the_server_cleanly():
    """A real process: the URL line on stderr, a request, then SIGTERM or SIGINT (Ctrl+C):
    exit 0, the envelope on stdout, the port closed."""
    procs = {stop: _start("--file", OBD, "--bind", "127.0.0.1:0", "--duration", "30") for stop in ("SIGTERM", "SIGINT")}
    outcomes = {}
    try:
        for stop, proc in procs.items():
            line = proc.stderr.readline()
            match = re.fullmatch(r"canarchy: web serve: .* on (http://127\.0\.0\.1:\d+/) \(read-only; Ctrl\+C to stop\)\n",
                                 line)
            assert match, line
            url = match.group(1)
            assert json.loads(get(url + "api/status")[2])["data"]["frame_count"] == 3854
            proc.send_signal(getattr(signal, stop))
            started = time.monotonic()
            out, err = proc.communicate(timeout=30)  # a hang detector, not a speed target
            outcomes[stop] = (proc.returncode, time.monotonic() - started, out, err, url)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for stop, (code, elapsed, out, err, url) in outcomes.items():
        assert code == 0, (stop, err)
        assert "Traceback" not in err, (stop, err)
        envelope = json.loads(out)
        assert (envelope["ok"], envelope["data"]["stopped_by"], envelope["data"]["url"]) == (True, stop, url)
        assert envelope["data"]["requests"] == 1
