"""The one printer (canarchy.output): streamed --json/--jsonl/--text, closed pipes, Ctrl+C/SIGTERM."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from canarchy import output
from canarchy.errors import EXIT_OUTPUT_CLOSED, UserInputError
from tests.helpers import run_cli

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
LEAF = CAPTURES / "nissan_leaf_uds_79b_7bb.log"
TRUCK = CAPTURES / "j1939_truck_idle.log"
LEAF_DBC = CAPTURES / "css_tp_uds_nissan_leaf.dbc"


def _sorted_pairs(pairs):
    keys = [k for k, _ in pairs]
    assert keys == sorted(keys), keys
    return dict(pairs)


def strict_json(text: str):
    """Parse ``text`` as one JSON document whose objects all have sorted keys."""
    return json.loads(text, object_pairs_hook=_sorted_pairs)


def _printer(fmt: str, **kwargs) -> tuple[output.Printer, io.StringIO]:
    out = io.StringIO()
    return output.Printer(fmt, out, "test", **kwargs, err=out), out  # --text's error and warnings in the same text


# -- the printer ---------------------------------------------------------------------------------

def test_json_streams_events_into_one_sorted_envelope():
    printer, out = _printer("json")
    stream = printer.stream("unit:test")
    for n in range(3):
        stream.emit("tick", {"n": n, "b": [1, {"z": 1, "a": 2}]}, timestamp=float(n))
    printer.finish(output.CommandResult(data={"zeta": 1, "alpha": 2, "count": stream.count}, warnings=["w"]), None)
    envelope = strict_json(out.getvalue())
    assert envelope["data"]["events"] == [
        {"event_type": "tick", "payload": {"b": [1, {"a": 2, "z": 1}], "n": n}, "source": "unit:test",
         "timestamp": float(n)} for n in range(3)]
    assert (envelope["data"]["alpha"], envelope["data"]["count"], envelope["warnings"]) == (2, 3, ["w"])
    event_lines = [line for line in out.getvalue().splitlines() if line.startswith('      {"event_type": "tick"')]
    assert len(event_lines) == 3  # one line per event inside the indented envelope


def test_json_spool_moves_to_a_file_and_back(monkeypatch):
    monkeypatch.setattr(output, "SPOOL_MEMORY_BYTES", 1000)
    printer, out = _printer("json")
    stream = printer.stream("unit:test")
    for n in range(2000):
        stream.emit("tick", {"n": n}, timestamp=0.0)
    assert stream._spool._rolled  # past 1000 bytes the spool is a temporary file
    printer.finish(output.CommandResult(data={}), None)
    assert [e["payload"]["n"] for e in strict_json(out.getvalue())["data"]["events"]] == list(range(2000))


def test_jsonl_always_closes_with_the_envelope():
    printer, out = _printer("jsonl")
    printer.stream("unit:test").emit("tick", {"n": 1}, timestamp=1.0)
    printer.finish(None, UserInputError("BAD", "bad input", "fix it"))
    first, closing = [strict_json(line) for line in out.getvalue().splitlines()]
    assert first["event_type"] == "tick"
    assert closing == {"command": "test", "data": {}, "errors": [{"code": "BAD", "hint": "fix it",
                                                                   "message": "bad input"}],
                       "ok": False, "warnings": []}


def test_text_prints_event_lines_then_the_summary():
    printer, out = _printer("text", render_event=lambda e: f"event {e['payload']['n']}",
                            render_text=lambda r: f"{r.data['count']} events")
    stream = printer.stream("unit:test")
    stream.emit("tick", {"n": 1})
    stream.emit("tick", {"n": 2})
    printer.finish(output.CommandResult(data={"count": stream.count}, warnings=["careful"]), None)
    assert out.getvalue() == "event 1\nevent 2\n2 events\nwarning: careful\n"


def test_keep_false_counts_without_printing():
    for fmt in ("json", "jsonl", "text"):
        printer, out = _printer(fmt, render_event=str)
        stream = printer.stream("unit:test", keep=False)
        stream.emit("tick", {})
        assert stream.count == 1
        printer.finish(output.CommandResult(data={"n": 1}), None)
        assert "tick" not in out.getvalue() and "events" not in out.getvalue()


def test_stoppable_ends_the_block_and_says_why():
    printer, _out = _printer("jsonl")
    stream = printer.stream("unit:test")
    with stream.stoppable():
        stream.emit("tick", {})
        raise KeyboardInterrupt("SIGTERM")
    assert (stream.count, stream.stopped_by) == (1, "SIGTERM")


def test_one_encoder_gives_json_dumps_text():
    encode = output.json_encoder()
    value = {"b": [1.5, None, True, "ü\n"], "a": {"y": 1, "x": float("inf")}}
    assert encode(value) == json.dumps(value, sort_keys=True)
    with pytest.raises(TypeError):
        encode({"a": object()})


# -- every command ----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["uds", "services"],
    ["capture", "--file", str(LEAF), "--count", "3"],
    ["generate", "--dry-run", "--count", "3", "--seed", "1"],
    ["isotp", "decode", "--file", str(LEAF), "--request-id", "0x79B", "--response-id", "0x7BB"],
    ["j1939", "decode", "--file", str(TRUCK), "--pgn", "65226"],
    ["decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC)],
    ["capture", "--file", str(CAPTURES / "nonesuch.log")],
])
def test_every_jsonl_output_ends_with_the_envelope_and_json_is_one_sorted_document(argv):
    lines = run_cli(*argv, "--jsonl").out.splitlines()
    parsed = [strict_json(line) for line in lines]
    assert all("event_type" in line for line in parsed[:-1])
    assert set(parsed[-1]) == {"command", "data", "errors", "ok", "warnings"} and "events" not in parsed[-1]["data"]
    whole = strict_json(run_cli(*argv, "--json").out)
    assert whole["ok"] is parsed[-1]["ok"]
    assert [(e["event_type"], e["payload"]) for e in whole["data"].get("events", [])] == [
        (e["event_type"], e["payload"]) for e in parsed[:-1]]


def _signal_at_frame(monkeypatch: pytest.MonkeyPatch, index: int, name: str) -> None:
    """Every capture file read from now on is stopped at its frame ``index`` as ``canarchy.cli.main`` stops a
    command on the signal ``name`` (``KeyboardInterrupt(name)``)."""
    from canarchy.capture_file import CaptureFile

    iter_frames = CaptureFile.__iter__

    def cut(self):
        for number, frame in enumerate(iter_frames(self)):
            if number == index:
                raise KeyboardInterrupt(name)
            yield frame

    monkeypatch.setattr(CaptureFile, "__iter__", cut)


@pytest.mark.parametrize("argv", [
    ["capture", "--file", str(TRUCK)],
    ["capture", "--file", str(TRUCK), "--summary"],
    ["j1939", "decode", "--file", str(TRUCK)],
    ["decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC)],
    ["isotp", "decode", "--file", str(LEAF), "--request-id", "0x79B", "--response-id", "0x7BB"],
], ids=["capture", "summary", "j1939", "dbc", "isotp"])
@pytest.mark.parametrize("fmt", ["--json", "--jsonl", "--text"])
def test_a_recording_read_cut_short_by_a_signal_says_so(argv, fmt, monkeypatch, tmp_path):
    """A signal in the middle of reading a file ends the command with what it read so far, its result says it
    was stopped, and its exit code is 128 + the signal's (a script or `timeout` took exit 0 for the whole):
    a part is never reported as the whole."""
    _signal_at_frame(monkeypatch, 200, "SIGTERM")
    result = run_cli(*argv, fmt)
    assert result.code == 128 + signal.SIGTERM
    if fmt == "--text":
        assert "stopped by SIGTERM" in result.out or "stopped_by: SIGTERM" in result.out
        return
    envelope = strict_json(result.out.splitlines()[-1] if fmt == "--jsonl" else result.out)
    assert envelope["ok"] is True and envelope["data"]["stopped_by"] == "SIGTERM"
    monkeypatch.undo()
    assert "stopped_by" not in strict_json(run_cli(*argv, "--json").out)["data"]


@pytest.mark.parametrize("summary", [False, True], ids=["frames", "summary"])
def test_a_conversion_cut_short_by_a_signal_leaves_no_file(summary, monkeypatch, tmp_path):
    """A conversion (`capture --file X --output Y`) a signal stops before the end of X did not finish: a Y of the
    frames so far, renamed into place, read as the whole recording. No file is left, the envelope says so."""
    _signal_at_frame(monkeypatch, 200, "SIGINT")
    target = tmp_path / "converted.asc"
    result = run_cli("capture", "--file", str(TRUCK), "--output", str(target), *(["--summary"] * summary), "--json")
    envelope = strict_json(result.out)
    assert result.code == 128 + signal.SIGINT and envelope["data"]["stopped_by"] == "SIGINT"
    assert envelope["data"]["output"]["kept"] is False and envelope["data"]["output"]["frames_written"] == 200
    assert list(tmp_path.iterdir()) == []


# -- a closed pipe and signals, in a real process ------------------------------------------------------

def _canarchy(*argv: str) -> list[str]:
    return [sys.executable, "-m", "canarchy", *argv]


def _first_line_through_head(*argv: str) -> tuple[bytes, bytes, int]:
    """``canarchy ARGV | head -1``: the line head printed, canarchy's stderr and exit code."""
    producer = subprocess.Popen(_canarchy(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-1"], stdin=producer.stdout, stdout=subprocess.PIPE)
    producer.stdout.close()  # only head reads the pipe now
    try:
        first, _ = head.communicate(timeout=120)
        err = producer.stderr.read()
        code = producer.wait(timeout=60)
    finally:
        for proc in (producer, head):
            if proc.poll() is None:
                proc.kill()
    return first, err, code


@pytest.mark.parametrize("fmt", ["--jsonl", "--text", "--json"])
def test_a_closed_pipe_ends_the_stream_quietly(fmt):
    # `canarchy … | head -1`: the reader goes away after one line.
    # --json writes at the end: a run that ends by itself, whose envelope is far larger than a pipe holds
    count = "100000" if fmt == "--json" else "1000000000"
    first, err, code = _first_line_through_head("generate", "--dry-run", "--count", count, fmt)
    assert first.strip()
    assert (err, code) == (b"", EXIT_OUTPUT_CLOSED)


def test_sigterm_ends_an_endless_stream_with_the_closing_envelope():
    proc = subprocess.Popen(_canarchy("generate", "--dry-run", "--count", "1000000000", "--jsonl"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1000):
            assert strict_json(proc.stdout.readline())["event_type"] == "frame_planned"
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    closing = strict_json(rest.splitlines()[-1])
    assert (proc.returncode, err) == (0, "")
    assert closing["ok"] is True and closing["data"]["stopped_by"] == "SIGTERM"
    assert closing["data"]["frames_shown"] >= 1000


class _CutShort(io.StringIO):
    """A pipe whose reader stopped reading: the interrupt arrives in the middle of a write."""

    cut = False

    def write(self, text: str) -> int:
        if self.cut or len(text) < 40:
            return super().write(text)
        self.cut = True
        super().write(text[: len(text) // 2])  # what the kernel took before the write blocked
        raise KeyboardInterrupt("SIGTERM")


@pytest.mark.parametrize("live", [False, True], ids=["batched", "flushed"])
def test_an_interrupt_inside_a_write_still_ends_with_a_closing_line_of_its_own(live):
    """The signal that stops a stream can cut a line short in a blocked write (the rest is lost):
    the closing envelope still starts a line of its own and parses."""
    out = _CutShort()
    printer = output.Printer("jsonl", out, "test")
    stream = printer.stream("test", live=live)
    with stream.stoppable():
        for index in range(10_000):
            stream.emit("frame_planned", {"index": index})
    printer.finish(None, None)
    closing = strict_json(out.getvalue().splitlines()[-1])
    assert out.cut and closing["data"]["stopped_by"] == "SIGTERM"


def test_ctrl_c_closes_a_json_stream_with_its_events(monkeypatch):
    from canarchy.commands import generate

    real, calls = generate._frame_payload, []

    def payload(*args):
        calls.append(1)
        if len(calls) == 500:
            raise KeyboardInterrupt  # what Ctrl+C raises, at the 500th planned frame
        return real(*args)

    monkeypatch.setattr(generate, "_frame_payload", payload)
    result = run_cli("generate", "--dry-run", "--count", "1000000000", "--json")
    envelope = strict_json(result.out)
    assert result.code == 0 and envelope["data"]["stopped_by"] == "SIGINT"
    assert len(envelope["data"]["events"]) == envelope["data"]["frames_shown"] == 499


# -- frames written directly ----------------------------------------------------------------------

def _frames():
    from canarchy.candump import parse_candump_line
    from canarchy.frames import CanFrame

    return [parse_candump_line("(1641469561.949700) can0 79B#022101FFFFFFFFFF"),
            parse_candump_line("(0.000001) vcan%d\\\\\"x 18FEF100##3" + "00" * 12),
            parse_candump_line("(1700000000) can1 123#R4"),
            CanFrame(0x7E8, b"\x01", timestamp=1.5, channel=None),
            CanFrame(0x7E8, b"", timestamp=float("nan"), channel="can0"),
            CanFrame(0x1FFFFFFF, b"\xff" * 8, True, timestamp=1e22, channel="ü"),
            parse_candump_line("(1641469561.949700) can0 79B#022101FFFFFFFFFF")]


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_frames_written_directly_are_the_json_of_their_payload(fmt):
    direct, direct_out = _printer(fmt)
    generic, generic_out = _printer(fmt)
    for frame in _frames():
        direct.stream("file:x%s.log").emit_frame("frame", frame)
        generic.stream("file:x%s.log").emit("frame", frame.to_payload(), frame.timestamp)
    for printer in (direct, generic):
        printer.finish(output.CommandResult(data={}), None)
    if fmt == "jsonl":
        assert [json.loads(line) for line in direct_out.getvalue().splitlines()] == \
               [json.loads(line) for line in generic_out.getvalue().splitlines()]
    else:
        assert (json.loads(direct_out.getvalue())["data"]["events"]
                == json.loads(generic_out.getvalue())["data"]["events"])
    # the log's own text of the timestamp, the first frame's (written both ways to check) too
    assert direct_out.getvalue().count('"timestamp": 1641469561.949700') == 4  # the first and the last frame


def test_a_writer_that_disagrees_with_to_payload_is_not_used(monkeypatch):
    from canarchy.candump import parse_candump_line

    monkeypatch.setattr(output, "frame_json_writer", lambda encode, source: lambda event_type, frame: '{"x": 1}')
    printer, out = _printer("jsonl")
    frame = parse_candump_line("(1.5) can0 123#01")
    for _ in range(3):
        printer.stream("s").emit_frame("frame", frame)
    printer.finish(output.CommandResult(data={}), None)
    assert [json.loads(line)["payload"] for line in out.getvalue().splitlines()[:-1]] == [frame.to_payload()] * 3


def _frame_run(live: bool) -> str:
    """--jsonl of a stream that mixes frames, other events and a direct write, ended by finish()."""
    from canarchy.capture_file import open_capture

    printer, out = _printer("jsonl")
    stream = printer.stream("file:x.log", live=live)
    for number, frame in enumerate(open_capture(LEAF)):
        stream.emit_frame("frame", frame)
        if number % 100 == 99:
            stream.emit("note", {"n": number}, 1.5)
    printer.write("not an event\n")
    stream.emit_frame("frame", frame)
    printer.finish(output.CommandResult(data={"frames": stream.count}), None)
    return out.getvalue()


def test_held_jsonl_lines_come_out_as_written_at_once():
    """Lines held for one write per batch: the same bytes, in the same order, as a live stream's."""
    assert _frame_run(live=False) == _frame_run(live=True)


def test_jsonl_lines_are_held_up_to_a_batch_and_a_live_stream_writes_each_at_once():
    from canarchy.capture_file import open_capture

    frames = list(open_capture(TRUCK))[: output.PENDING_LINES + 10]
    printer, out = _printer("jsonl")
    stream = printer.stream("file:x.log")
    for frame in frames:
        stream.emit_frame("frame", frame)
    assert out.getvalue().count("\n") == output.PENDING_LINES  # whole lines only
    printer.finish(output.CommandResult(data={}), None)
    assert out.getvalue().count("\n") == len(frames) + 1
    live, live_out = _printer("jsonl")
    live.stream("capture:can0", live=True).emit_frame("frame", frames[0])
    assert live_out.getvalue().count("\n") == 1


def test_ctrl_c_in_a_jsonl_capture_writes_every_frame_it_counted(monkeypatch):
    from canarchy import capture_file

    real = capture_file.open_capture

    class Interrupted:
        """The capture, with Ctrl+C at its 600th frame."""

        def __init__(self, path, **options):
            self.capture = real(path, **options)

        def __getattr__(self, name):
            return getattr(self.capture, name)

        def __iter__(self):
            for number, frame in enumerate(self.capture):
                if number == 599:
                    raise KeyboardInterrupt
                yield frame

    monkeypatch.setattr(capture_file, "open_capture", Interrupted)
    lines = run_cli("capture", "--file", str(TRUCK), "--jsonl").out.splitlines()
    assert len(lines) == 600 and strict_json(lines[-1])["data"]["frame_count"] == 599
    assert all(strict_json(line)["event_type"] == "frame" for line in lines[:-1])


def test_a_closed_pipe_ends_a_capture_file_quietly(tmp_path):
    # `canarchy capture --file LOG --jsonl | head -1` on a log far larger than a pipe holds
    log = tmp_path / "long.log"
    log.write_text(TRUCK.read_text(encoding="ascii") * 10, encoding="ascii")
    first, err, code = _first_line_through_head("capture", "--file", str(log), "--jsonl")
    assert strict_json(first)["event_type"] == "frame"
    assert (err, code) == (b"", EXIT_OUTPUT_CLOSED)


# -- an output that cannot be written: one line on stderr, never a traceback -------------------------

_UNWRITABLE_RUNS = [
    ("capture", "--file", str(TRUCK)),
    ("capture", "--file", str(TRUCK), "--summary"),
    ("decode", "--file", str(LEAF), "--dbc", str(LEAF_DBC), "--json"),
    ("j1939", "decode", "--file", str(TRUCK)),
    ("isotp", "decode", "--file", str(LEAF), "--jsonl"),
    ("capture", "--file", "no-such-capture.log", "--json"),  # the error envelope itself (--text: on stderr)
    ("--version",), ("capture", "--help"),  # argparse's own printing, which ignored a failed write
]


def _run_id(argv: tuple[str, ...]) -> str:
    """A test id the same in every copy of the tree (no absolute path: the parity twins run on two copies)."""
    return " ".join([*argv[:2], *(Path(a).name if "/" in a else a for a in argv[2:])])


def _assert_one_output_error(err: str, code: int, why: str) -> None:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[-1].startswith("canarchy: error: OUTPUT_WRITE_FAILED: Cannot write the output to standard output: ")
    assert why in lines[-1] and " hint: " in lines[-1]
    assert code == 2


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("argv", _UNWRITABLE_RUNS, ids=_run_id)
def test_a_full_disk_under_stdout_is_one_error_line(argv):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(_canarchy(*argv), stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    _assert_one_output_error(proc.stderr, proc.returncode, "No space left on device")


@pytest.mark.parametrize("argv", _UNWRITABLE_RUNS, ids=_run_id)
def test_a_closed_stdout_is_one_error_line(argv):
    # `canarchy … >&-`: Python starts with sys.stdout None
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *_canarchy(*argv)], stderr=subprocess.PIPE,
                          text=True, timeout=120)
    _assert_one_output_error(proc.stderr, proc.returncode, "it is closed")


def test_the_file_size_limit_is_an_error_not_sigxfsz(tmp_path):
    # `(ulimit -f 64; canarchy capture --file LOG --jsonl > out.jsonl)`: SIGXFSZ would end the process
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    target = tmp_path / "out.jsonl"
    with target.open("w") as out:
        proc = subprocess.run(_canarchy("capture", "--file", str(TRUCK), "--jsonl"), stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=limit)
    _assert_one_output_error(proc.stderr, proc.returncode, "File too large")


def test_a_failed_write_in_process_reports_and_keeps_the_commands_own_error(capsys, tmp_path):
    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    from canarchy.cli import main

    code = main(["capture", "--file", str(tmp_path / "missing.log")], stdout=Full())
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 2
    assert err[0].startswith("canarchy: error: CAPTURE_SOURCE_UNAVAILABLE: ")
    assert err[1].startswith("canarchy: error: OUTPUT_WRITE_FAILED: ")


# -- memory does not grow with the input ------------------------------------------------------------

class _Sink:
    """A stdout that keeps nothing (so that only canarchy's own memory is measured)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _peak(argv: list[str]) -> int:
    import tracemalloc

    from canarchy.cli import main

    tracemalloc.start()
    try:
        assert main(argv, stdout=_Sink()) == 0
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _truck_lines(tmp_path: Path, count: int) -> Path:
    """The first ``count`` frames of the J1939 truck log, cycled with later timestamps as needed."""
    lines = TRUCK.read_text(encoding="ascii").splitlines()
    path = tmp_path / f"truck_{count}.log"
    with path.open("w", encoding="ascii") as out:
        for n in range(count):
            stamp, rest = lines[n % len(lines)].split(" ", 1)
            out.write(f"({float(stamp[1:-1]) + n // len(lines) * 10000:.6f}) {rest}\n")
    return path


@pytest.mark.parametrize("fmt", ["--json", "--jsonl", "--text"])
@pytest.mark.parametrize("command", [
    ["capture", "--file", "{log}"],
    ["decode", "--file", "{log}", "--dbc", str(CAPTURES / "css_j1939_demo.dbc")],
    ["j1939", "decode", "--file", "{log}"],
])
def test_memory_does_not_grow_with_the_capture(tmp_path, monkeypatch, command, fmt):
    monkeypatch.setattr(output, "SPOOL_MEMORY_BYTES", 64 * 1024)  # --json spools to a file past this
    small, large = _truck_lines(tmp_path, 1000), _truck_lines(tmp_path, 5000)
    argv = lambda log: [part.format(log=log) for part in command] + [fmt]  # noqa: E731
    _peak(argv(small))  # warm-up: imports, the DBC, the catalog
    assert _peak(argv(large)) < _peak(argv(small)) * 1.25 + 256 * 1024


@pytest.mark.parametrize("fmt", ["--json", "--jsonl", "--text"])
def test_a_long_dry_run_plans_in_flat_memory(monkeypatch, fmt):
    monkeypatch.setattr(output, "SPOOL_MEMORY_BYTES", 64 * 1024)
    base = ["generate", "--dry-run", "--seed", "1", fmt, "--count"]
    _peak(base + ["2000"])
    assert _peak(base + ["20000"]) < _peak(base + ["2000"]) * 1.25 + 256 * 1024


def test_a_reason_that_ends_a_sentence_leaves_one_full_stop(tmp_path):
    """Messages, hints and warnings put an OS or library reason (which may end with '.') before their own
    full stop: the envelope and --text show one. Ranges ('0..8'), ellipses and '..' paths stay."""
    from canarchy.errors import UserInputError, one_full_stop
    from canarchy.warning_log import WarningRecord

    assert one_full_stop("cannot be read: Permission denied..") == "cannot be read: Permission denied."
    assert one_full_stop("stopped: busy.. Try again..") == "stopped: busy. Try again."
    for kept in ("DLC 0..8.", "wait...", "cd .. first.", "R8_9 .. R8_F."):
        assert one_full_stop(kept) == kept
    error = UserInputError("X", "bad: reason..", "Do this..")
    assert (error.message, error.hint) == ("bad: reason.", "Do this.")
    assert WarningRecord("W", "odd line: why..") == "odd line: why."
    result = output.CommandResult(data={}, warnings=["plain: because.."])
    assert output.envelope("t", result, None)["warnings"] == ["plain: because."]
    printer, out = _printer("text")
    printer.finish(result, None)
    assert "warning: plain: because.\n" in out.getvalue()


def test_warnings_merged_from_several_logs_keep_the_order_they_came_in():
    """``data.warning_records`` and ``--text``'s lines are in the order the warnings came, kinds mixed; each
    kind's count stays whole past the records kept (docs/decoding.md)."""
    from canarchy.warning_log import WarningLog

    source, merged = WarningLog(per_kind=2), WarningLog(per_kind=2)
    for code, t in (("B", 1), ("A", 2), ("B", 3), ("A", 4), ("B", 5)):
        source.add(code, f"{code} at t={t}")
    merged.add("A", "A at t=0")
    merged.merge(source)
    assert [record.message for record in merged.records] == ["A at t=0", "B at t=1", "A at t=2", "B at t=3"]
    assert merged.counts == {"A": 3, "B": 3}


# -- terminal control characters from input are escaped in --text -------------------------------------

_RAW_CONTROLS = [chr(c) for c in (*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))]


def test_text_output_escapes_control_characters_from_a_capture(tmp_path):
    log = tmp_path / "esc.log"
    log.write_text("(1.000000) \x1b[31mcan0 123#01\n(2.000000) ca\x00n 123#02\n(3.000000) c\x9bn 123#03\n")
    text = run_cli("capture", "--file", str(log), "--text").out
    assert not any(char in text for char in _RAW_CONTROLS)
    assert "\\x1b[31mcan0" in text and "ca\\x00n" in text and "c\\x9bn" in text
    # JSON keeps the channel as it was read
    events = run_cli("capture", "--file", str(log), "--json").data["events"]
    assert [e["payload"]["channel"] for e in events] == ["\x1b[31mcan0", "ca\x00n", "c\x9bn"]


def test_an_error_quoting_input_escapes_control_characters(tmp_path):
    dbc = tmp_path / "esc.dbc"
    dbc.write_text('VERSION ""\nBO_ \x1b]0;title\x07 this \x1b[2J\n', encoding="utf-8")
    log = tmp_path / "x.log"
    log.write_text("(1.000000) can0 123#01\n")
    result = run_cli("decode", "--file", str(log), "--dbc", str(dbc), "--text")
    assert result.code == 3 and "DBC_LOAD_FAILED" in result.err
    assert not any(char in result.err for char in _RAW_CONTROLS)
    assert "\\x1b]0;title\\x07" in result.err


def test_an_error_on_stderr_escapes_control_characters(capsys, tmp_path):
    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    from canarchy.cli import main

    dbc = tmp_path / "esc.dbc"
    dbc.write_text('VERSION ""\nBO_ \x1b[2J this\n', encoding="utf-8")
    log = tmp_path / "x.log"
    log.write_text("(1.000000) can0 123#01\n")
    main(["decode", "--file", str(log), "--dbc", str(dbc)], stdout=Full())
    err = capsys.readouterr().err
    assert "DBC_LOAD_FAILED" in err and "\x1b" not in err and "\\x1b[2J" in err
