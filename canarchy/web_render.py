"""What the dashboard (:mod:`canarchy.web`) shows: the HTML pages and the SVG plot of a signal.

Every capture and DBC value is escaped (``html.escape``); the pages carry their script and style inline,
allowed by :data:`CONTENT_SECURITY_POLICY` through their SHA-256 digests. A plot reduces any number of
values to one minimum and one maximum per pixel column (:class:`MinMaxBuckets`).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import html
import math
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from canarchy.output import number_text

if TYPE_CHECKING:
    from canarchy.web import Dashboard, DashboardServer


# --- the plot ---------------------------------------------------------------------------------

#: Size of a plot (px) and of its margins; one bucket per pixel column of the plot area.
PLOT_WIDTH, PLOT_HEIGHT = 900, 320
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 70, 20, 28, 42


class MinMaxBuckets:
    """Values over ``[start, end]`` reduced to ``count`` buckets, each keeping its minimum and
    maximum (value and time) and its count: a line through them draws every peak of any number
    of points in bounded memory (one bucket per pixel column)."""

    def __init__(self, start: float, end: float, count: int) -> None:
        self.start = start
        self.span = max(end - start, 1e-9)
        self.count = count
        self.buckets: dict[int, list[float]] = {}  # index -> [n, t_min, v_min, t_max, v_max]
        self.points = 0

    def add(self, stamp: float, value: float) -> None:
        self.points += 1
        index = min(self.count - 1, max(0, int((stamp - self.start) / self.span * self.count)))
        bucket = self.buckets.get(index)
        if bucket is None:
            self.buckets[index] = [1, stamp, value, stamp, value]
            return
        bucket[0] += 1
        if value < bucket[2]:
            bucket[1], bucket[2] = stamp, value
        if value > bucket[4]:
            bucket[3], bucket[4] = stamp, value

    def line(self) -> list[tuple[float, float]]:
        """``(time, value)`` points in time order: per bucket its minimum and maximum, earlier first."""
        points: list[tuple[float, float]] = []
        for index in sorted(self.buckets):
            _n, t_min, v_min, t_max, v_max = self.buckets[index]
            pair = sorted({(t_min, v_min), (t_max, v_max)})
            points += pair
        return points


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values covering ``low..high`` (1, 2, 5 x 10^n steps)."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def render_plot(dashboard: Dashboard, message: str, signal: str, width: int = PLOT_WIDTH,
                height: int = PLOT_HEIGHT) -> str:
    """An SVG line plot of ``message.signal`` over the capture's time (relative seconds on x).

    The values are read again from the file and reduced with :class:`MinMaxBuckets` (one bucket
    per pixel column). Every text is escaped. Raises KeyError when the signal is unknown.
    """
    summary = dashboard.signal(message, signal)
    if summary is None:
        raise KeyError(f"{message}.{signal}")
    stats = dashboard.stats
    end = stats.end if stats.end is not None else dashboard.start
    plot_w = width - _MARGIN_LEFT - _MARGIN_RIGHT
    plot_h = height - _MARGIN_TOP - _MARGIN_BOTTOM
    buckets = MinMaxBuckets(dashboard.start, end, plot_w)
    for stamp, value in dashboard.series(message, signal):
        buckets.add(stamp, value)
    line = buckets.line()
    unit = summary.get("unit") or ""
    title = f"{message}.{signal}" + (f" ({unit})" if unit else "")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}" class="plot" '
             f'data-message="{_e(message)}" data-signal="{_e(signal)}" data-points="{buckets.points}">',
             f"<title>{_e(title)}: {buckets.points} values over {end - dashboard.start:.3f} s</title>",
             f'<rect x="{_MARGIN_LEFT}" y="{_MARGIN_TOP}" width="{plot_w}" height="{plot_h}" fill="#fbfbfb" '
             'stroke="#ccc"/>',
             f'<text x="{_MARGIN_LEFT}" y="18" font-size="13" font-family="sans-serif">{_e(title)}</text>']
    if not line:
        parts.append(f'<text x="{_MARGIN_LEFT + 10}" y="{_MARGIN_TOP + 24}" font-size="12" '
                     'font-family="sans-serif">no numeric values</text></svg>')
        return "".join(parts)
    values = [v for _t, v in line]
    low, high = min(values), max(values)
    if high == low:
        low, high = low - 1, high + 1
    span_t = max(end - dashboard.start, 1e-9)

    def x(stamp: float) -> float:
        return _MARGIN_LEFT + (stamp - dashboard.start) / span_t * plot_w

    def y(value: float) -> float:
        return _MARGIN_TOP + plot_h - (value - low) / (high - low) * plot_h

    for tick in _ticks(low, high):
        parts.append(f'<line x1="{_MARGIN_LEFT}" x2="{_MARGIN_LEFT + plot_w}" y1="{y(tick):.1f}" '
                     f'y2="{y(tick):.1f}" stroke="#e4e4e4"/>'
                     f'<text class="ytick" x="{_MARGIN_LEFT - 6}" y="{y(tick) + 4:.1f}" font-size="11" '
                     f'text-anchor="end" font-family="sans-serif">{_e(f"{tick:g}")}</text>')
    for tick in _ticks(0.0, span_t):
        parts.append(f'<text class="xtick" x="{x(dashboard.start + tick):.1f}" y="{_MARGIN_TOP + plot_h + 16}" '
                     f'font-size="11" text-anchor="middle" font-family="sans-serif">{_e(f"{tick:g}")}</text>')
    parts.append(f'<text x="{_MARGIN_LEFT + plot_w / 2:.0f}" y="{height - 8}" font-size="11" text-anchor="middle" '
                 'font-family="sans-serif">time since the first frame (s)</text>')
    points = " ".join(f"{x(t):.2f},{y(v):.2f}" for t, v in line)
    parts.append(f'<polyline class="series" fill="none" stroke="#1f5fa8" stroke-width="1.3" points="{points}"/>')
    parts.append("</svg>")
    return "".join(parts)


# --- the page ---------------------------------------------------------------------------------


_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; font: 12px/1.3 ui-monospace, monospace; }
th, td { border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } .meta { color: #555; } .num { text-align: right; }
.cols { display: flex; flex-wrap: wrap; gap: 2em; align-items: flex-start; }
svg.plot { border: 1px solid #ddd; background: #fff; }
"""

_SCRIPT = """
(function () {
  var start = parseFloat(document.body.getAttribute("data-start")) || 0;
  var body = document.getElementById("live-body");
  var status = document.getElementById("live-status");
  var cells = {};
  Array.prototype.forEach.call(document.querySelectorAll("td[data-live-id]"), function (td) {
    cells[td.getAttribute("data-live-id")] = td;
  });
  var counts = {}, recent = [], count = 0, pending = false, ended = null, opened = Date.now();
  function hexId(id, extended) {
    var s = id.toString(16).toUpperCase();
    while (s.length < (extended ? 8 : 3)) { s = "0" + s; }
    return s;
  }
  function render() {
    pending = false;
    var rows = document.createDocumentFragment();
    for (var i = recent.length - 1; i >= 0; i--) {
      var tr = document.createElement("tr");
      recent[i].forEach(function (text) {
        var td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      });
      rows.appendChild(tr);
    }
    while (body.firstChild) { body.removeChild(body.firstChild); }
    body.appendChild(rows);
    Object.keys(counts).forEach(function (id) { if (cells[id]) { cells[id].textContent = String(counts[id]); } });
    var seconds = (Date.now() - opened) / 1000;
    status.textContent = count + " events" + (seconds > 0 ? " (" + Math.round(count / seconds) + "/s)" : "") +
      (ended ? "; replay ended (" + ended + ")" : "");
  }
  function add(cellsOfRow) {
    recent.push(cellsOfRow);
    if (recent.length > 200) { recent.shift(); }
    count += 1;
    if (!pending) { pending = true; setTimeout(render, 100); }
  }
  var source = new EventSource("/api/events");
  source.addEventListener("frame", function (e) {
    var p = JSON.parse(e.data).payload, id = hexId(p.arbitration_id, p.is_extended_id);
    counts[id] = (counts[id] || 0) + 1;
    add([(p.timestamp - start).toFixed(6), "frame", id, String(p.dlc), p.data.toUpperCase()]);
  });
  source.addEventListener("decoded_message", function (e) {
    var p = JSON.parse(e.data).payload;
    var values = Object.keys(p.signals).map(function (name) {
      var s = p.signals[name];
      return name + "=" + s.value + (s.unit ? " " + s.unit : "");
    });
    add([(p.timestamp - start).toFixed(6), p.message, hexId(p.arbitration_id, p.arbitration_id > 0x7FF), "",
         values.join("  ")]);
  });
  source.addEventListener("end", function (e) {
    ended = JSON.parse(e.data).reason;
    source.close();
    render();
  });
  source.onerror = function () {
    ended = ended || "the stream closed";
    source.close();
    render();
  };
})();
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


#: The pages' Content-Security-Policy: their own inline script and style, connections to this origin.
CONTENT_SECURITY_POLICY = (f"default-src 'none'; script-src {_sha256(_SCRIPT)}; style-src {_sha256(_STYLE)}; "
                           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _number(value: Any) -> str:
    return number_text(value, none="")


def _utc(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(stamp, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def _head(title: str) -> str:
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>canarchy: {_e(title)}</title><style>{_STYLE}</style></head>")


def _signal_link(message: str, signal: str) -> str:
    return f"/signal?{urlencode({'message': message, 'signal': signal})}"


def render_page(server: DashboardServer) -> str:
    """The dashboard's HTML (every capture and DBC value escaped; times relative to the first frame)."""
    d = server.dashboard
    decoded = "" if d.decoded_count is None else f", {d.decoded_count} decoded messages with {_e(d.dbc)}"
    parts = [
        _head(d.file),
        f"<body data-start=\"{d.start!r}\"><h1>canarchy web: {_e(d.file)}</h1>",
        f"<p class=\"meta\" id=\"summary\">{d.frame_count} frames ({_e(d.format)}){decoded}, "
        f"{d.stats.duration:.3f} s from {_utc(d.stats.start)} (t = 0). "
        f"Read-only; status as JSON at <a href=\"/api/status\">/api/status</a>, IDs at "
        f"<a href=\"/api/ids\">/api/ids</a>, events at <a href=\"/api/events\">/api/events</a>.</p>",
    ]
    if d.warnings:
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{_e(w)}</li>" for w in d.warnings) + "</ul>")
    if d.summary is not None:
        parts += _signals_section(d)
    parts += _ids_section(d)
    parts.append("<h2>Live</h2><p class=\"meta\" id=\"live-status\">connecting to /api/events ...</p>"
                 "<table id=\"live\"><thead><tr><th class=\"num\">time (s)</th><th>event</th><th>ID</th>"
                 "<th class=\"num\">DLC</th><th>data</th></tr></thead><tbody id=\"live-body\"></tbody></table>")
    parts += _frames_section(d)
    parts.append(f"<script>{_SCRIPT}</script></body></html>\n")
    return "".join(parts)


def _signals_section(d: Dashboard) -> list[str]:
    """The decoded signals (each with a link to its plot) and a plot of the one with the most values."""
    from canarchy.frames import can_id_text

    parts = ["<h2>Decoded signals</h2><table id=\"signals\"><thead><tr><th>message</th><th>ID</th>"
             "<th class=\"num\">count</th><th>signal</th><th class=\"num\">min</th><th class=\"num\">max</th>"
             "<th class=\"num\">last</th><th>unit</th><th>plot</th></tr></thead><tbody>"]
    busiest: tuple[int, str, str] | None = None
    for name, message in d.summary["messages"].items():
        ids = " ".join(can_id_text(i, extended) for i, extended in sorted(d.message_ids.get(name, ())))
        for signal_name, s in message["signals"].items():
            if isinstance(s.get("min"), (int, float)) and (busiest is None or s["count"] > busiest[0]):
                busiest = (s["count"], name, signal_name)
            parts.append(f"<tr><td>{_e(name)}</td><td>{ids}</td>"
                         f"<td class=\"num\">{s['count']}</td><td>{_e(signal_name)}</td>"
                         f"<td class=\"num\">{_e(_number(s['min']))}</td><td class=\"num\">{_e(_number(s['max']))}</td>"
                         f"<td class=\"num\">{_e(_number(s['last']))}</td><td>{_e(s['unit'])}</td>"
                         f"<td><a href=\"{_e(_signal_link(name, signal_name))}\">plot</a></td></tr>")
    parts.append("</tbody></table>")
    if busiest is not None:
        parts.append(f"<p class=\"meta\">the signal with the most values; every signal's plot is a link above</p>"
                     f"{render_plot(d, busiest[1], busiest[2])}")
    return parts


def _ids_section(d: Dashboard) -> list[str]:
    parts = [f"<h2>Arbitration IDs</h2><p class=\"meta\">{len(d.stats.ids())} IDs; rates over each ID's own "
             "first to last frame; live: frames of the replay below so far</p>"
             "<table id=\"ids\"><thead><tr><th>ID</th><th class=\"num\">count</th><th class=\"num\">rate (Hz)"
             "</th><th class=\"num\">period (ms)</th><th>DLC</th><th class=\"num\">first (s)</th>"
             "<th class=\"num\">last (s)</th><th>last data</th><th>decoded as</th><th class=\"num\">live</th>"
             "</tr></thead><tbody>"]
    for row in d.stats.to_dict()["ids"]:
        period = "" if row["period_s"] is None else f"{row['period_s'] * 1000:.3f}"
        rate = "" if row["rate_hz"] is None else f"{row['rate_hz']:.3f}"
        messages = " ".join(sorted(d.id_messages.get((row["arbitration_id"], row["is_extended_id"]), ())))
        parts.append(f"<tr><td>{row['id']}</td><td class=\"num\">{row['count']}</td><td class=\"num\">{rate}</td>"
                     f"<td class=\"num\">{period}</td><td>{','.join(str(x) for x in row['dlcs'])}</td>"
                     f"<td class=\"num\">{row['first_s']:.6f}</td><td class=\"num\">{row['last_s']:.6f}</td>"
                     f"<td>{row['last_data'].upper()}</td><td>{_e(messages)}</td>"
                     f"<td class=\"num\" data-live-id=\"{row['id']}\">0</td></tr>")
    parts.append("</tbody></table>")
    return parts


def _frames_section(d: Dashboard) -> list[str]:
    from canarchy.frames import can_id_text

    parts = [f"<h2>Frames</h2><p class=\"meta\">the first {len(d.rows)} of {d.frame_count}</p>"
             "<table id=\"frames\"><thead><tr><th class=\"num\">time (s)</th><th>channel</th><th>ID</th>"
             "<th class=\"num\">DLC</th><th>data</th><th>decoded</th></tr></thead><tbody>"]
    for frame, messages in d.rows:
        parts.append(f"<tr><td class=\"num\">{frame['timestamp'] - d.start:.6f}</td><td>{_e(frame['channel'])}</td>"
                     f"<td>{can_id_text(frame['arbitration_id'], frame['is_extended_id'])}</td>"
                     f"<td class=\"num\">{frame['dlc']}</td>"
                     f"<td>{_e(frame['data'].upper())}</td><td>{_e(' '.join(messages))}</td></tr>")
    parts.append("</tbody></table>")
    return parts


def render_signal_page(server: DashboardServer, message: str, signal: str) -> str:
    """A page with one signal's plot and summary. Raises KeyError when the signal is unknown."""
    d = server.dashboard
    plot = render_plot(d, message, signal)
    s = d.signal(message, signal)
    return "".join([
        _head(f"{message}.{signal}"),
        f"<body><h1>{_e(message)}.{_e(signal)}</h1>",
        f"<p class=\"meta\"><a href=\"/\">back to {_e(d.file)}</a>; the plot as SVG: "
        f"<a href=\"{_e('/plot.svg?' + urlencode({'message': message, 'signal': signal}))}\">plot.svg</a></p>",
        plot,
        "<table id=\"signal\"><tbody>",
        *(f"<tr><th>{key}</th><td>{_e(_number(s.get(key)))}</td></tr>"
          for key in ("count", "min", "max", "last", "unit")),
        "</tbody></table></body></html>\n",
    ])
