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
import html.parser
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from canarchy import web, web_bind
from canarchy.cli import main
from canarchy.commands import web as web_command
from tests.helpers import run_cli, same_value_ids

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
        server = web.DashboardServer(web_bind.parse_bind("127.0.0.1:0"), web.Dashboard(file, dbc), **options)
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


class Tables(html.parser.HTMLParser):
    """Every ``<table id=...>`` of a page as rows of cell texts; ``live`` cells by their data-live-id."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.live: dict[str, str] = {}
        self._table = self._row = self._cell = self._live = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(attrs.get("id", ""), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell, self._live = [], attrs.get("data-live-id")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell)
            self._row.append(text)
            if self._live:
                self.live[self._live] = text
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables(page: str) -> Tables:
    parser = Tables()
    parser.feed(page)
    return parser


def candump_id(arbitration_id: int) -> str:
    return f"{arbitration_id:08X}" if arbitration_id > 0x7FF else f"{arbitration_id:03X}"


def test_the_page_lists_frames_and_decoded_signals(serve):
    server = serve(TRUCK, TRUCK_DBC)
    status, headers, body = get(server.url)
    page = body.decode()
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "3582 frames (candump), 1100 decoded messages" in page
    frames = log_frames(TRUCK)
    start = frames[0][0]
    assert "from 2021-10-25T19:00:55.020850Z (t = 0)" in page  # the first frame, once, in UTC
    rows = tables(page).tables["frames"][1:]
    assert [(r[0], r[2], r[4]) for r in rows] == [
        (f"{t - start:.6f}", candump_id(i), d.upper()) for t, i, d in frames[:web.PAGE_ROWS]]  # relative times
    assert rows[2][2:] == ["0CF00400", "8", "607D84481400F084", "EEC1"]  # EEC1 decoded by PGN
    # the signal summary: EEC1 engine speed over the whole capture, on the ID it was decoded from
    signals = {(r[0], r[3]): r for r in tables(page).tables["signals"][1:]}
    assert signals[("EEC1", "EngineSpeed")][:8] == ["EEC1", "0CF00400", "1000", "EngineSpeed", "646.75", "653.75",
                                                    "648.75", "rpm"]


def test_per_id_rows_with_counts_and_rates(serve):
    server = serve(TRUCK, TRUCK_DBC)
    page = tables(get(server.url)[2].decode())
    stamps: dict[str, list[float]] = {}
    for t, i, _d in log_frames(TRUCK):
        stamps.setdefault(candump_id(i), []).append(t)
    start = log_frames(TRUCK)[0][0]
    rows = {r[0]: r for r in page.tables["ids"][1:]}
    assert sorted(rows) == sorted(stamps) and len(rows) == 45
    for ident, times in stamps.items():
        row = rows[ident]
        assert int(row[1]) == len(times)
        assert float(row[2]) == pytest.approx((len(times) - 1) / (times[-1] - times[0]), abs=0.0005)
        assert float(row[5]) == pytest.approx(times[0] - start, abs=1e-6)
    assert rows["0CF00400"][8] == "EEC1" and rows["0CFEF100"][8] == "CCVS1"
    assert page.live["0CF00400"] == "0"  # filled by the live view as the replay goes
    ids = json.loads(get(server.url + "api/ids")[2])
    assert ids["command"] == "web ids" and ids["data"]["ids"] == run_cli(
        "capture", "--file", TRUCK, "--summary", "--json").data["ids"]


def test_one_id_notation_everywhere(serve):
    page = get(serve(TRUCK, TRUCK_DBC).url)[2].decode()
    parsed = tables(page)
    cells = [r[0] for r in parsed.tables["ids"][1:]] + [r[2] for r in parsed.tables["frames"][1:]]
    cells += [ident for r in parsed.tables["signals"][1:] for ident in r[1].split()]
    assert cells and all(re.fullmatch(r"[0-9A-F]{3}|[0-9A-F]{8}", c) for c in cells), cells
    script = re.search(r"<script>(.*)</script>", page, re.S).group(1)
    assert '"0x"' not in script and script.count("hexId(") >= 3  # the live rows use the same notation


def test_an_11_bit_and_a_29_bit_id_of_the_same_value_are_told_apart(serve, tmp_path):
    # one real OBD-II answer, then the same bytes on the 29-bit ID of the same value: two messages of the DBC
    log, dbc = same_value_ids(tmp_path, Path(OBD), "1900000000.0")
    parsed = tables(get(serve(str(log), str(dbc)).url)[2].decode())
    assert {r[0]: r[1] for r in parsed.tables["signals"][1:]} == {"STD": "7E8", "EXT": "000007E8"}
    assert {r[0]: r[8] for r in parsed.tables["ids"][1:]} == {"7E8": "STD", "000007E8": "EXT"}


def plot_svg(server, message="EEC1", signal="EngineSpeed"):
    status, headers, body = get(server.url + "plot.svg?" + urllib.parse.urlencode({"message": message,
                                                                                   "signal": signal}))
    return status, headers, body


def test_a_decoded_signal_is_plotted_as_svg(serve):
    server = serve(TRUCK, TRUCK_DBC)
    status, headers, body = plot_svg(server)
    assert status == 200 and headers["Content-Type"] == "image/svg+xml; charset=utf-8"
    svg = ET.fromstring(body)
    ns = {"s": "http://www.w3.org/2000/svg"}
    values = [e["payload"]["signals"]["EngineSpeed"]["value"] for e in run_cli(
        "decode", "--file", TRUCK, "--dbc", TRUCK_DBC, "--json").data["events"] if e["payload"]["message"] == "EEC1"]
    assert int(svg.get("data-points")) == len(values) == 1000
    frame = svg.find("s:rect", ns)
    left, top = float(frame.get("x")), float(frame.get("y"))
    width, height = float(frame.get("width")), float(frame.get("height"))
    points = [tuple(map(float, pair.split(","))) for pair in svg.find("s:polyline", ns).get("points").split()]
    xs, ys = [x for x, _ in points], [y for _, y in points]
    assert xs == sorted(xs) and left <= xs[0] and xs[-1] <= left + width
    assert len(points) <= 2 * width                    # reduced to the pixel columns ...
    assert (min(ys), max(ys)) == (pytest.approx(top), pytest.approx(top + height))   # ... keeping every extreme
    low, high = min(values), max(values)
    labels = [float(t.text) for t in svg.findall("s:text", ns) if t.get("class") == "ytick"]
    assert labels and low <= min(labels) and max(labels) <= high
    title = svg.find("s:title", ns).text
    assert title.startswith("EEC1.EngineSpeed (rpm): 1000 values")


def test_the_signal_page_and_its_errors(serve):
    server = serve(TRUCK, TRUCK_DBC)
    status, headers, body = get(server.url + "signal?message=EEC1&signal=EngineSpeed")
    page = body.decode()
    assert status == 200 and "Content-Security-Policy" in headers
    assert '<svg xmlns="http://www.w3.org/2000/svg"' in page and 'class="plot"' in page
    assert dict(r for r in tables(page).tables["signal"]) == {"count": "1000", "min": "646.75", "max": "653.75",
                                                            "last": "648.75", "unit": "rpm"}
    main_page = get(server.url)[2].decode()
    assert 'href="/signal?message=EEC1&amp;signal=EngineSpeed"' in main_page
    assert main_page.count("<svg") == 1  # the busiest signal, plotted on the main page too
    for query, code, status_code in (("message=EEC1&signal=Nope", "WEB_SIGNAL_NOT_FOUND", 404),
                                     ("message=EEC1", "WEB_QUERY_INVALID", 400)):
        for route in ("signal", "plot.svg"):
            status, _headers, body = get(server.url + route + "?" + query)
            assert (status, json.loads(body)["errors"][0]["code"]) == (status_code, code)
    status, _headers, body = plot_svg(serve(OBD))
    assert status == 404 and "--dbc" in json.loads(body)["errors"][0]["hint"]


def test_the_live_stream_replays_the_whole_recording(serve):
    server = serve(TRUCK, TRUCK_DBC)
    events = sse(get(server.url + "api/events?speed=0")[2])
    assert events[-1] == ("end", {"event_count": 3582 + 1100, "truncated": False, "reason": "end_of_capture"})
    assert json.loads(get(server.url + "api/status")[2])["data"]["event_limit"] is None


def test_streaming_a_long_recording_keeps_memory_flat(serve, tmp_path):
    """10,000 frames: the stream holds one frame at a time, so its peak memory is far below the recording's."""
    import tracemalloc

    path = tmp_path / "long.log"
    path.write_text("".join(f"({1600000000 + n / 1000:.6f}) can0 {0x100 + n % 40:03X}#{n:016X}\n"
                            for n in range(10_000)))
    server = serve(str(path))
    tracemalloc.start()
    try:
        with urllib.request.urlopen(server.url + "api/events?speed=0", timeout=120) as response:
            count, tail = 0, b""
            while chunk := response.read(1 << 16):
                count += (tail[-20:] + chunk).count(b"event: frame") - tail[-20:].count(b"event: frame")
                tail = chunk
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 10_000 and b"end_of_capture" in tail
    assert peak < 2 * 2**20  # the 10,000 events kept as dicts would take about 7 MB


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
    (t0, *_), (_t1, *_), (t2, *_) = log_frames(OBD)[:3]  # 5.8 ms, then 194 ms apart
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
    bind = web_bind.parse_bind(text)
    assert (bind.host, bind.port, bind.family, bind.loopback) == expected


def test_remote_hosts_need_allow_remote():
    bind = web_bind.parse_bind("0.0.0.0:8765", allow_remote=True)
    assert (bind.host, bind.loopback) == ("0.0.0.0", False)
    assert web_bind.parse_bind("dashboard.lan:80", allow_remote=True).host == "dashboard.lan"


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
    assert web_command.HELP_DEFAULTS == {"bind": web_bind.DEFAULT_BIND, "event_limit": web.DEFAULT_EVENT_LIMIT,
                                         "max_event_limit": web.MAX_EVENT_LIMIT}
    assert web.DEFAULT_EVENT_LIMIT is None  # a stream replays the whole recording unless asked for less
    assert web_bind.DEFAULT_BIND == "127.0.0.1:8765"


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
        ["web", "serve", "--file", LEAF, "--dbc", LEAF_DBC, "--bind", "127.0.0.1:0", "--duration", "2",
         "--jsonl"], stdout=out)))  # 2 s: the two requests below must end within it on a loaded machine
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
            match = re.fullmatch(r"canarchy: web serve: .* on (http://127\.0\.0\.1:\d+/) "
                                 r"\(read-only; Ctrl\+C to stop\)\n", line)
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
    for stop, (code, _elapsed, out, err, url) in outcomes.items():
        assert code == 0, (stop, err)
        assert "Traceback" not in err, (stop, err)
        envelope = json.loads(out)
        assert (envelope["ok"], envelope["data"]["stopped_by"], envelope["data"]["url"]) == (True, stop, url)
        assert envelope["data"]["requests"] == 1


# -- in a real browser ----------------------------------------------------------------------------

def _browser() -> str | None:
    import shutil

    return next((found for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
                 if (found := shutil.which(name))), None)


def _headless(browser: str, tmp_path: Path, url: str, *options: str) -> subprocess.CompletedProcess:
    """One headless run of the browser with a fresh profile in ``tmp_path``; nothing but loopback is fetched."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=8000"]
    env = dict(os.environ, HOME=str(tmp_path))
    return subprocess.run([browser, *flags, *options, url], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)


def test_the_dashboard_in_a_headless_browser(serve, tmp_path):
    """Chromium renders the page, runs its script under the page's policy, follows the whole replay, and
    the screenshot is a real picture. Skipped, saying why, where no browser is installed."""
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium or Chrome on PATH (on Debian: apt-get install -y chromium)")
    server = serve(TRUCK, TRUCK_DBC, speed=0)
    dom = _headless(browser, tmp_path, server.url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = tables(dom.stdout)
    status = re.search(r'id="live-status">([^<]*)<', dom.stdout).group(1)
    assert status.startswith(f"{3582 + 1100} events") and status.endswith("replay ended (end_of_capture)"), status
    counts = {row[0]: row[1] for row in page.tables["ids"][1:]}
    assert page.live == counts                           # every frame of the replay counted, per ID
    live_rows = page.tables["live"][1:]
    assert len(live_rows) == 200                         # the newest 200, no more
    assert live_rows[0][0] == f"{log_frames(TRUCK)[-1][0] - log_frames(TRUCK)[0][0]:.6f}"  # the last, relative
    assert "Refused" not in dom.stderr and "Content Security Policy" not in dom.stderr
    shot = tmp_path / "dashboard.png"
    picture = _headless(browser, tmp_path, server.url, f"--screenshot={shot}", "--window-size=1280,1600")
    assert picture.returncode == 0, picture.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (1280, 1600)
    assert len(data) > 50_000                            # tables and a plot, not a blank page
