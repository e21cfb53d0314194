"""canarchy.capture_file and `capture --file`: real candump logs, other formats, malformed input, errors."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import contextlib
import gzip
import json
import os
import subprocess
import sys
import tracemalloc
from datetime import datetime
from pathlib import Path

import pytest

from canarchy import candump, capture_file
from canarchy.candump import parse_candump_line
from canarchy.capture_file import CaptureFile, open_capture
from canarchy.cli import main
from canarchy.errors import CanarchyError, TransportError, UserInputError
from canarchy.warning_log import MAX_PER_KIND
from tests.helpers import resource_warnings, run_cli, write_user_config

CAPTURES = Path(__file__).parent.parent / "fixtures" / "captures"
TRUCK = CAPTURES / "j1939_truck_idle.log"
LEAF = CAPTURES / "nissan_leaf_uds_79b_7bb.log"
SKODA = CAPTURES / "obd2_skoda_7e0_7e8.log"


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="ascii").splitlines()


# -- the real logs -------------------------------------------------------------------------


@pytest.mark.parametrize("path, frames", [(TRUCK, 3582), (LEAF, 221), (SKODA, 3854)])
def test_real_logs_read_completely_without_warnings(path, frames):
    capture = open_capture(path)
    got = list(capture)
    assert len(got) == frames == len(_lines(path))
    assert capture.frame_count == frames and capture.line_count == frames
    assert capture.all_warnings() == [] and capture.malformed_count == 0
    stamps = [f.timestamp for f in got]
    assert stamps == sorted(stamps)
    assert all(f.dlc == 8 and f.channel == "can0" and not f.is_fd for f in got)


@pytest.mark.parametrize("path", [TRUCK, LEAF, SKODA], ids=lambda p: p.name)
def test_frames_equal_python_cans_own_reader(path):
    """An independent reference: python-can's CanutilsLogReader on the same file."""
    import can

    with can.io.CanutilsLogReader(str(path)) as reader:
        expected = [(m.timestamp, m.arbitration_id, m.is_extended_id, bytes(m.data)) for m in reader]
    got = [(f.timestamp, f.arbitration_id, f.is_extended_id, f.data) for f in open_capture(path)]
    assert got == expected


def test_id_width_decides_11_or_29_bit():
    truck = next(iter(open_capture(TRUCK)))
    assert (truck.arbitration_id, truck.is_extended_id) == (0x18F00E00, True)
    assert truck.data == bytes.fromhex("821639C4FFFFFFFF") and truck.timestamp == 1635188455.020850
    leaf = next(iter(open_capture(LEAF)))
    assert (leaf.arbitration_id, leaf.is_extended_id, leaf.data) == (0x79B, False, bytes.fromhex("022101FFFFFFFFFF"))
    # 3 digits are an 11-bit ID even when the value is small; 8 digits are 29-bit even when small.
    assert parse_candump_line("(1.000000) can0 00000123#00").is_extended_id is True
    assert parse_candump_line("(1.000000) can0 123#00").is_extended_id is False


# -- the candump line grammar ------------------------------------------------------------------


def test_can_fd_line():
    frame = parse_candump_line("(1700000000.000100) can1 1A2##3" + "00112233445566778899AABB")
    assert frame.is_fd and frame.data == bytes.fromhex("00112233445566778899AABB") and frame.dlc == 12
    assert frame.channel == "can1" and frame.arbitration_id == 0x1A2


def test_remote_frames_keep_their_dlc():
    plain = parse_candump_line("(1.000000) can0 123#R")
    with_dlc = parse_candump_line("(1.000000) can0 18DAF110#R4")
    assert plain.is_remote_frame and plain.data == b"" and plain.dlc == 0
    assert with_dlc.is_remote_frame and with_dlc.dlc == 4 and with_dlc.is_extended_id
    assert with_dlc.to_payload()["dlc"] == 4


def test_every_remote_frame_dlc_reads_back_as_canarchy_writes_it():
    """DLC 0..15 of a remote frame in cansend's syntax (can-utils lib.c: ``R``, ``R1`` .. ``R8``, and
    ``R8_9`` .. ``R8_F`` for a raw DLC above 8), read back by the candump parser."""
    from canarchy.frame_syntax import format_frame
    from canarchy.frames import CanFrame

    bodies = [format_frame(CanFrame(0x123, b"", is_remote_frame=True, requested_dlc=dlc)) for dlc in range(16)]
    assert bodies[:2] + bodies[8:10] + bodies[15:] == ["123#R", "123#R1", "123#R8", "123#R8_9", "123#R8_F"]
    assert [parse_candump_line(f"(1.000000) can0 {body}").dlc for body in bodies] == list(range(16))
    for bad in ("R7_9", "R8_8", "R8_", "R8_9A"):
        with pytest.raises(ValueError, match="remote frame DLC"):
            parse_candump_line(f"(1.000000) can0 123#{bad}")


def test_a_data_frame_s_raw_dlc_reads_as_candump_writes_it():
    """can-utils ``lib.c``: a Classical CAN data frame of 8 bytes with a DLC of 9..15 is ``ID#<8 bytes>_9`` .. ``_F``
    in a candump ``-l`` log (Linux ``can_frame.len8_dlc``); ``candump -8`` prints its DLC as ``{9}``."""
    from canarchy.frame_syntax import format_frame, frame_line

    frame = parse_candump_line("(1.000000) can0 123#1122334455667788_9")
    assert (frame.data, frame.len8_dlc, frame.dlc, frame.to_payload()["dlc"]) == (bytes.fromhex("1122334455667788"),
                                                                                9, 9, 9)
    assert format_frame(frame) == "123#1122334455667788_9"
    assert frame_line(frame.to_payload()) == "(1.000000)  can0  123   {9}  11 22 33 44 55 66 77 88"
    assert [parse_candump_line(f"(1.0) can0 18DAF110#0011223344556677_{d}").len8_dlc for d in "9ABCDEF"] == \
        list(range(9, 16))
    for bad in ("11223344_9", "1122334455667788_8", "1122334455667788_", "1122334455667788_9A"):
        with pytest.raises(ValueError):
            parse_candump_line(f"(1.000000) can0 123#{bad}")


@pytest.mark.parametrize("suffix", [".log", ".asc", ".blf", ".csv", ".trc", ".jsonl"])
def test_a_conversion_keeps_raw_dlcs(tmp_path, suffix):
    """A DLC above 8 of a data frame (and of a remote frame, where the format has remote frames) survives every
    format canarchy writes; python-can's .log writer and ASC reader lose it."""
    source = tmp_path / "raw.log"
    source.write_text("(1.000000) can0 123#1122334455667788_9\n(2.000000) can0 124#R8_A\n"
                      "(3.000000) can0 125#1122334455667788\n", encoding="ascii")
    out = tmp_path / f"out{suffix}"
    if suffix == ".jsonl":
        out.write_text(run_cli("capture", "--file", str(source), "--jsonl").out, encoding="utf-8")
    else:
        assert run_cli("capture", "--file", str(source), "--output", str(out), "--json").code == 0
    got = {f.arbitration_id: f.dlc for f in open_capture(out)}
    assert got == ({0x123: 9, 0x125: 8} if suffix == ".trc" else {0x123: 9, 0x124: 10, 0x125: 8})


def test_a_log_conversion_keeps_a_frame_stamped_before_the_previous_one(tmp_path):
    """candump -l logs of several interfaces need not be in time order; python-can's .log writer moved such a
    frame to the previous one's time."""
    source = tmp_path / "steps.log"
    source.write_text("(1700000000.500000) can0 123#11 R\n(1700000000.100000) can1 124#22 T\n"
                      "(1700000000.700000) can0 125#33 R\n", encoding="ascii")
    out = tmp_path / "out.log"
    assert run_cli("capture", "--file", str(source), "--output", str(out), "--json").code == 0
    assert out.read_text(encoding="ascii") == source.read_text(encoding="ascii")


@pytest.mark.parametrize("suffix", [".asc", ".blf", ".log", ".trc", ".csv"])
def test_a_frame_stamped_before_the_first_is_kept_or_said(tmp_path, suffix):
    """.asc and .blf hold offsets from their start (the first frame): an earlier frame is written at the start,
    with a warning (python-can's ASC writer wrote its absolute time as the offset: read back, 2077)."""
    source = tmp_path / "steps.log"
    source.write_text("(1700000000.500000) can0 123#11\n(1700000000.100000) can1 124#22\n"
                      "(1700000000.700000) can0 125#33\n", encoding="ascii")
    out = tmp_path / f"out{suffix}"
    result = run_cli("capture", "--file", str(source), "--output", str(out), "--json")
    stamps = [round(f.timestamp, 6) for f in open_capture(out)]
    notes = [w for w in result.envelope["warnings"] if "before the first" in w]
    if suffix in (".asc", ".blf"):
        assert stamps == [1700000000.5, 1700000000.5, 1700000000.7] and len(notes) == 1 and "1 frame(s)" in notes[0]
    else:
        assert stamps == [1700000000.5, 1700000000.1, 1700000000.7] and notes == []


def test_direction_suffix_and_empty_payload_and_blank_line():
    assert parse_candump_line("(1.000000) can0 123#0102 R").data == b"\x01\x02"
    assert parse_candump_line("(1.000000) can0 123#").data == b""
    assert parse_candump_line("   \n") is None


@pytest.mark.parametrize("line, why", [
    ("can0 123#00", "field"),
    ("1.000000 can0 123#00", "parentheses"),
    ("(abc) can0 123#00", "timestamp"),
    ("(nan) can0 123#00", "timestamp"),
    ("(1.0) can0 1234#00", "4 hex digits"),
    ("(1.0) can0 12G#00", "not hex"),
    ("(1.0) can0 123-00", "'#'"),
    ("(1.0) can0 123#0", "even number"),
    ("(1.0) can0 123#ZZ", "not a hex digit"),
    ("(1.0) can0 123#00Z100", "not a hex digit"),
    ("(1.0) can0 123##100G", "CAN FD data '00G' holds a character that is not a hex digit"),
    ("(1.0) can0 123##", "flags"),
    ("(1.0) can0 123#RX", "remote"),
])
def test_malformed_lines_say_why(line, why):
    with pytest.raises(ValueError, match=why):
        parse_candump_line(line)


@pytest.mark.parametrize("line", ["(1.0) can0 800#00", "(1.0) can0 123#001122334455667788"])
def test_frames_no_can_bus_can_carry_are_invalid(line):
    with pytest.raises(UserInputError) as info:
        parse_candump_line(line)
    assert info.value.code == "INVALID_FRAME"


def test_corrupted_lines_warn_with_file_and_line_and_the_rest_is_read(tmp_path):
    lines = _lines(TRUCK)[:200]
    bad = {17: "(1635188455.2) can0 0CF00400#607", 42: "garbage", 43: "(1635188455.3) can0 0CF0040#607D84481400F084",
           100: "(x) can0 0CF00400#607D84481400F084", 150: "(1635188455.5) can0 0CF00400#607D84481400F0ZZ"}
    for number, text in bad.items():
        lines[number - 1] = text
    path = tmp_path / "corrupted.log"
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
    capture = open_capture(path)
    frames = list(capture)
    assert len(frames) == 200 - len(bad)
    assert capture.malformed_count == len(bad)
    assert [w.split(": ")[0] for w in capture.all_warnings()] == [f"{path}:{n}" for n in sorted(bad)]
    assert all("malformed candump line" in w for w in capture.all_warnings())
    assert "garbage" in capture.all_warnings()[1]


def test_crlf_and_non_ascii_bytes(tmp_path):
    path = tmp_path / "crlf.log"
    body = "\r\n".join(_lines(LEAF)[:10]).encode() + b"\r\n(1.0) can0 7BB#\xff\xfe\r\n"
    path.write_bytes(body)
    capture = open_capture(path)
    assert len(list(capture)) == 10
    assert capture.all_warnings() and capture.all_warnings()[0].startswith(f"{path}:11: malformed candump line")


@pytest.mark.parametrize("suffix", [".log", ".jsonl", ".log.gz"])
def test_a_byte_order_mark_before_the_first_line_is_not_part_of_it(suffix, tmp_path):
    """Editors on Windows may start a text file with U+FEFF; the first frame is read like the rest."""
    lines = _lines(LEAF)[:3]
    if suffix == ".jsonl":
        lines = [json.dumps({"event_type": "frame", "payload": parse_candump_line(line).to_payload()})
                 for line in lines]
    body = "\ufeff" + "\n".join(lines) + "\n"
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(gzip.compress(body.encode()) if suffix.endswith(".gz") else body.encode())
    capture = open_capture(path)
    assert [frame.arbitration_id for frame in capture] == [parse_candump_line(line).arbitration_id
                                                            for line in _lines(LEAF)[:3]]
    assert capture.all_warnings() == []


def test_a_file_of_no_canarchy_frame_names_canarchy_s_reader(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text('{"x": 1}\n')
    result = run_cli("capture", "--file", str(path), "--json")
    assert (result.code, result.error_codes) == (3, ["CAPTURE_FORMAT_INVALID"])
    assert "the canarchy --jsonl reader" in json.loads(result.out)["errors"][0]["message"]


def test_error_frames_are_counted_not_yielded(tmp_path):
    path = tmp_path / "err.log"
    path.write_text("(1.0) can0 20000080#0000000000000000\n(1.1) can0 123#01\n", encoding="ascii")
    capture = open_capture(path)
    assert [f.arbitration_id for f in capture] == [0x123]
    assert capture.error_frame_count == 1
    assert any("error frame" in w for w in capture.all_warnings())


def test_data_bytes_separated_by_dots_read_as_canplayer_reads_them(tmp_path):
    # can-utils' parse_canframe (canplayer, log2asc, log2long) takes an optional '.' before each byte, so a
    # hand-edited log DE.AD.BE.EF replays there; canarchy's reader called it malformed. The real DM1 by TP.BAM
    # of the truck log, written with dots, reads as the same frames and decodes to the same DTCs.
    lines = _lines(TRUCK)
    start = next(i for i, line in enumerate(lines) if " 1CECFF00#20120003FFCAFE00" in line)
    bam = [lines[start]] + [line for line in lines[start:] if " 1CEBFF00#" in line][:3]
    dotted = []
    for line in bam:
        head, data = line.split("#")
        dotted.append(head + "#" + ".".join(data[i:i + 2] for i in range(0, len(data), 2)))
    path = tmp_path / "dotted.log"
    path.write_text("\n".join(dotted) + "\n", encoding="ascii")
    plain = tmp_path / "plain.log"
    plain.write_text("\n".join(bam) + "\n", encoding="ascii")
    capture = open_capture(path)
    assert [f.to_payload() for f in capture] == [f.to_payload() for f in open_capture(plain)]
    assert capture.malformed_count == 0 and capture.all_warnings() == []
    dm1 = [e for e in run_cli("j1939", "decode", "--file", str(path), "--json").data["events"]
           if e["event_type"] == "j1939_dm1"]
    assert [(d["spn"], d["fmi"]) for d in dm1[0]["payload"]["dtcs"]] == [(980, 9), (3216, 20), (609, 9), (609, 12)]
    # CAN FD and a raw DLC too; a '.' inside a byte or two in a row stay malformed, as in lib.c
    assert parse_candump_line("(1.0) can0 123##1DE.AD.BE.EF.00.11.22.33.44.55.66.77").data.hex() == \
        "deadbeef0011223344556677"
    assert parse_candump_line("(1.0) can0 123#.11.22.33.44.55.66.77.88_9").len8_dlc == 9
    for bad in ("D.EAD", "DE..AD", "DE.A", "11.22.33.44.55.66.77.88._9"):
        with pytest.raises(ValueError, match=r"'\.' that is not between two bytes"):
            parse_candump_line(f"(1.0) can0 123#{bad}")


def test_warnings_are_bounded(tmp_path):
    path = tmp_path / "noise.log"
    path.write_text("junk\n" * 500 + _lines(LEAF)[0] + "\n", encoding="ascii")
    capture = open_capture(path)
    assert len(list(capture)) == 1
    assert capture.malformed_count == 500
    assert len(capture.log.records) == MAX_PER_KIND == len(capture.all_warnings()) - 1
    assert capture.log.counts == {"CANDUMP_LINE_MALFORMED": 500}
    assert capture.all_warnings()[-1] == ("450 more CANDUMP_LINE_MALFORMED warning(s) not listed "
                                          "(first 50 of 500 shown)")
    assert [r.details for r in capture.log.records[:2]] == [{"file": str(path), "line": 1},
                                                            {"file": str(path), "line": 2}]


@pytest.mark.parametrize("end", ["\n", "\r\n", ""])
def test_a_line_without_end_is_not_held_whole(tmp_path, end):
    """A file with a huge line (no line breaks: binary data named .log) is read in pieces: the line is
    malformed, the frames around it stand, and memory does not grow with the line."""
    first, last = _lines(LEAF)[:2]
    path = tmp_path / "long.log"
    path.write_text(f"{first}{end or chr(10)}{'A' * 8_000_000}{end}{last if end else ''}\n", encoding="ascii")
    capture = open_capture(path)
    tracemalloc.start()
    try:
        frames = list(capture)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(frames) == (2 if end else 1) and peak < 1_000_000, peak
    assert capture.log.counts == {"CANDUMP_LINE_MALFORMED": 1}
    assert "line longer than 4096 characters" in capture.all_warnings()[0]
    assert capture.log.records[0].details["line"] == 2


@pytest.mark.parametrize("suffix", [".asc", ".csv", ".trc", ".jsonl"])
def test_a_huge_line_in_any_text_format_is_not_held_whole(tmp_path, suffix):
    """python-can's text readers and the --jsonl reader take a line whole: a recording with a line of megabytes
    (damaged, or binary data named .asc) held it all, and a 2 GB file without line breaks ran out of memory.
    Lines are read in bounded pieces: memory does not grow with the line, the frames before it stand."""
    import can

    source = list(open_capture(LEAF))[:10]
    path = tmp_path / f"capture{suffix}"
    if suffix == ".jsonl":
        lines = [json.dumps({"event_type": "frame", "payload": f.to_payload()}) + "\n" for f in source]
    else:
        writer = {".asc": can.ASCWriter, ".csv": can.CSVWriter, ".trc": can.TRCWriter}[suffix](str(path))
        for frame in source:
            writer.on_message_received(can.Message(timestamp=frame.timestamp, arbitration_id=frame.arbitration_id,
                                                   is_extended_id=frame.is_extended_id, data=frame.data, channel=0))
        writer.stop()
        lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines) + "9" * 16_000_000 + "\n")
    capture = open_capture(path)
    tracemalloc.start()
    try:
        frames = []
        with contextlib.suppress(CanarchyError):
            frames.extend(capture)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6_000_000, peak  # a --jsonl line may hold 1 MiB, a line of the others 4,096 characters
    assert [f.data for f in frames] == [f.data for f in source], capture.all_warnings()


def test_a_json_document_past_its_limit_is_refused_before_it_is_read(tmp_path):
    """A --json document is parsed whole: one over 64 MiB is refused, pointing at --jsonl."""
    path = tmp_path / "huge.json"
    with open(path, "w") as handle:
        handle.write('{"data": {"events": [' + " " * (64 << 20) + "]}}")
    with pytest.raises(CanarchyError) as raised:
        list(open_capture(path))
    assert raised.value.code == "CAPTURE_FORMAT_UNSUPPORTED" and "--jsonl" in raised.value.hint


def test_gzip_candump(tmp_path):
    path = tmp_path / "leaf.log.gz"
    path.write_bytes(gzip.compress(LEAF.read_bytes()))
    assert [f.data for f in open_capture(path)] == [f.data for f in open_capture(LEAF)]


def test_reader_is_lazy_and_memory_stays_flat(tmp_path):
    """Streaming: peak memory for a 4x longer file is about the same."""
    lines = _lines(TRUCK)
    small, large = tmp_path / "small.log", tmp_path / "large.log"
    small.write_text("\n".join(lines) + "\n", encoding="ascii")
    large.write_text("\n".join(lines * 4) + "\n", encoding="ascii")

    def peak(path: Path) -> int:
        tracemalloc.start()
        try:
            count = sum(1 for _ in open_capture(path))
            assert count == len(lines) * (1 if path is small else 4)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak(small)  # warm-up
    assert peak(large) < peak(small) * 1.5 + 64 * 1024


# -- formats python-can reads ------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".asc", ".blf", ".csv", ".trc"])
def test_python_can_formats_round_trip(tmp_path, suffix):
    import can

    writers = {".asc": can.ASCWriter, ".blf": can.BLFWriter, ".csv": can.CSVWriter, ".trc": can.TRCWriter}
    source = list(open_capture(LEAF))[:40] + list(open_capture(TRUCK))[:40]
    path = tmp_path / f"capture{suffix}"
    writer = writers[suffix](str(path))
    for frame in source:
        writer.on_message_received(can.Message(timestamp=frame.timestamp, arbitration_id=frame.arbitration_id,
                                               is_extended_id=frame.is_extended_id, data=frame.data, channel=0))
    writer.stop()
    capture = open_capture(path)
    got = list(capture)
    assert capture.format == suffix[1:]
    assert [(f.arbitration_id, f.is_extended_id, f.data) for f in got] == \
           [(f.arbitration_id, f.is_extended_id, f.data) for f in source]
    # seconds since the epoch (the first recording's frames: the second one's are earlier, which these formats'
    # offsets from the first frame cannot hold); python-can's ASC header holds milliseconds, 4.6's unpadded
    error = max(abs(g.timestamp - f.timestamp) for g, f in zip(got[:40], source[:40], strict=True))
    assert error < (1e-3 if suffix == ".asc" else 1e-6)


def test_an_asc_trigger_block_s_milliseconds_written_without_leading_zeros_are_milliseconds():
    """python-can 4.6 writes 20 ms as ``55.20``; CANoe always writes three digits (``55.020``, ``55.200``)."""
    from canarchy.asc import AscReader

    # the date as python-can's reader hands it over (after the weekday)
    unpadded, padded = (AscReader._datetime_to_timestamp(f"Oct 25 19:00:55.{ms} 2021") for ms in ("20", "020"))
    assert unpadded == padded and AscReader._datetime_to_timestamp("Oct 25 19:00:55.200 2021") - padded > 0.17


_ASC_HEAD = "date Mon Oct 25 19:00:55.020 2021\nbase hex  timestamps absolute\n"


@pytest.mark.parametrize(("lines", "start"), [
    ("", "19:00:55.020"),  # no trigger block, no "internal events logged": the first frame ends the header
    ("Begin Triggerblock Mon Oct 25 19:01:00.500 2021\n", "19:01:00.500"),  # the trigger block's own line does
], ids=["frame", "trigger-block"])
def test_the_line_that_ends_an_asc_header_is_read(tmp_path, lines, start):
    """python-can 4.6's header loop reads the line after the header and drops it: a frame lost without a word,
    or the trigger block's date (the offsets then count from the header's)."""
    path = tmp_path / "short.asc"
    path.write_text(_ASC_HEAD + lines + "0.100000 1  123             Rx   d 1 11\n"
                    "0.200000 1  124             Rx   d 1 22\n", encoding="ascii")
    frames = list(open_capture(path))
    assert [(f.arbitration_id, f.data) for f in frames] == [(0x123, b"\x11"), (0x124, b"\x22")]
    from canarchy.asc import AscReader

    first = AscReader._datetime_to_timestamp(f"Oct 25 {start} 2021") + 0.1
    assert abs(frames[0].timestamp - first) < 1e-6


def test_an_asc_frame_with_fewer_data_bytes_than_its_dlc_is_an_invalid_frame(tmp_path):
    """python-can 4.6 reads ``d 2 33`` as a frame of one byte, without a word."""
    path = tmp_path / "short.asc"
    path.write_text(_ASC_HEAD + "0.100000 1  123             Rx   d 2 33\n"
                    "0.200000 1  124             Rx   d 1 22\n", encoding="ascii")
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.code == 0 and [e["payload"]["data"] for e in result.data["events"]] == ["22"], result.out
    assert result.data["warning_counts"] == {"CAPTURE_FRAME_INVALID": 1}
    assert "DLC says 2 data byte(s), it holds 1" in result.data["warning_records"][0]["message"]


@pytest.mark.parametrize("suffix", [".log", ".asc", ".blf", ".csv", ".trc"])
def test_a_conversion_keeps_each_frame_s_time(tmp_path, suffix):
    """``capture --file X --output Y``, then Y read back: every timestamp as it was (seconds since the epoch)."""
    source = list(open_capture(TRUCK))
    out = tmp_path / f"converted{suffix}"
    assert run_cli("capture", "--file", str(TRUCK), "--output", str(out), "--json").code == 0
    got = list(open_capture(out))
    assert len(got) == len(source)
    assert max(abs(g.timestamp - f.timestamp) for g, f in zip(got, source, strict=True)) < 1e-6


def test_an_output_through_a_symlink_replaces_its_target_and_keeps_its_permissions(tmp_path):
    """``--output LINK --overwrite`` writes where the link leads, as a shell's ``>`` does: the link
    stays, its target gets the frames and keeps its permission bits; nothing else is left beside it."""
    target = tmp_path / "logs" / "drive.log"
    target.parent.mkdir()
    target.write_text("")
    target.chmod(0o640)
    link = tmp_path / "latest.log"
    link.symlink_to(target)
    assert run_cli("capture", "--file", str(TRUCK), "--output", str(link), "--overwrite", "--json").code == 0
    assert link.is_symlink() and len(list(open_capture(target))) == len(list(open_capture(TRUCK)))
    assert target.stat().st_mode & 0o777 == 0o640 and os.listdir(target.parent) == ["drive.log"]


@pytest.mark.parametrize("suffix", [".log.gz", ".asc.gz", ".csv.gz", ".trc.gz"])
def test_a_conversion_to_a_gzipped_text_format_reads_back_whole(tmp_path, suffix):
    """``--output drive.log.gz`` (and the other text formats): gzip, as python-can's Logger writes it and as canarchy
    and python-can read it; each frame's ID and data kept."""
    import can

    out = tmp_path / f"converted{suffix}"
    assert run_cli("capture", "--file", str(TRUCK), "--output", str(out), "--json").code == 0
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    source = [(f.arbitration_id, f.data) for f in open_capture(TRUCK)]
    assert [(f.arbitration_id, f.data) for f in open_capture(out)] == source
    assert [(m.arbitration_id, bytes(m.data)) for m in can.LogReader(str(out))] == source


def test_a_gzipped_blf_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "converted.blf.gz"
    result = run_cli("capture", "--file", str(TRUCK), "--output", str(out), "--json")
    assert (result.code, result.error_codes, os.listdir(tmp_path)) == (1, ["CAPTURE_FORMAT_UNSUPPORTED"], [])


def _blf(path: Path, frames: list, **options) -> bytes:
    import can

    writer = can.BLFWriter(str(path), **options)
    for frame in frames:
        writer.on_message_received(can.Message(timestamp=frame.timestamp, arbitration_id=frame.arbitration_id,
                                               is_extended_id=frame.is_extended_id, data=frame.data, channel=0))
    writer.stop()
    return path.read_bytes()


@pytest.mark.parametrize("where", ["inside an object", "inside an object's header", "at an object's end"])
def test_a_cut_blf_keeps_its_frames_and_says_so(tmp_path, where):
    """python-can's BLF reader stops quietly where a file is cut; canarchy warns (CAPTURE_READ_STOPPED)."""
    source = list(open_capture(TRUCK))
    whole = _blf(tmp_path / "whole.blf", source, max_container_size=4096)
    second = whole.index(b"LOBJ", whole.index(b"LOBJ") + 1)  # the second container (python-can: 144-byte header)
    cut = {"inside an object": len(whole) // 2, "inside an object's header": second + 7,
           "at an object's end": second}[where]
    path = tmp_path / "cut.blf"
    path.write_bytes(whole[:cut])
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.code == 0 and result.data["warning_counts"] == {"CAPTURE_READ_STOPPED": 1}, result.out
    got = [(e["payload"]["arbitration_id"], e["payload"]["data"]) for e in result.data["events"]]
    assert 0 < len(got) < len(source)
    assert got == [(f.arbitration_id, f.data.hex()) for f in source[:len(got)]]
    assert "the file ends" in result.data["warning_records"][0]["message"]
    assert run_cli("capture", "--file", str(tmp_path / "whole.blf"), "--json").data["warning_counts"] == {}


def test_a_trc_file_s_buses_are_the_channels_asc_and_blf_give(tmp_path):
    """python-can's TRC reader gives bus 1 as channel 1, its ASC and BLF readers as 0, and its TRC writer
    adds 1: without care each .trc conversion moves every frame to the next channel."""
    source = tmp_path / "multi.log"
    source.write_text("(1.0) can0 123#11\n(2.0) can1 124#22\n(3.0) can3 125#33\n", encoding="ascii")
    channels = {}
    for suffix in (".asc", ".blf", ".trc"):
        out = tmp_path / f"multi{suffix}"
        assert run_cli("capture", "--file", str(source), "--output", str(out), "--json").code == 0
        channels[suffix] = [f.channel for f in open_capture(out)]
    again = tmp_path / "again.trc"
    assert run_cli("capture", "--file", str(tmp_path / "multi.trc"), "--output", str(again), "--json").code == 0
    channels["again"] = [f.channel for f in open_capture(again)]
    assert channels == {key: ["0", "1", "3"] for key in (".asc", ".blf", ".trc", "again")}
    header = [line for line in again.read_text().splitlines() if line.startswith(";   /")]
    assert header == [f";   {again.resolve()}"]  # the file's own name, not its temporary one's


def _blf_objects(data: bytes) -> list[int]:
    """The offsets of a BLF file's top-level objects (after its header), as python-can writes them."""
    import struct

    offsets, offset = [], struct.unpack_from("<I", data, 4)[0]
    while offset < len(data):
        offsets.append(offset)
        size = struct.unpack_from("<I", data, offset + 8)[0]
        offset += size + size % 4
    return offsets


@pytest.mark.parametrize("container", [0, 1])
def test_a_blf_container_compressed_with_an_unknown_method_is_said(tmp_path, container):
    """python-can logs "Unknown compression method" and skips the container (its frames lost, the next
    container's read as garbage); canarchy stops there: an error when no frame came before, else a warning."""
    import struct

    source = list(open_capture(TRUCK))[:200]
    whole = bytearray(_blf(tmp_path / "whole.blf", source, max_container_size=1024))
    objects = _blf_objects(bytes(whole))
    assert len(objects) > 2
    struct.pack_into("<H", whole, objects[container] + 16, 7)  # the container's compression method
    path = tmp_path / "odd.blf"
    path.write_bytes(bytes(whole))
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.err == ""
    if container == 0:
        assert (result.code, result.error_codes) == (1, ["CAPTURE_FORMAT_UNSUPPORTED"])
        error = result.envelope["errors"][0]
        assert f"byte {objects[0]}) is a container compressed with method 7" in error["message"]
        assert "zlib" in error["hint"] and ".asc" in error["hint"]
    else:
        assert result.code == 0 and result.data["warning_counts"] == {"CAPTURE_READ_STOPPED": 1}, result.out
        assert 0 < result.data["frame_count"] < len(source)
        assert "compressed with method 7" in result.data["warning_records"][0]["message"]


@pytest.mark.parametrize(("mode", "offsets"), [("relative", [1.0, 1.8, 2.05]), ("absolute", [1.0, 0.5, 0.25])])
def test_an_asc_file_s_relative_timestamps_are_deltas_to_the_previous_event(tmp_path, mode, offsets):
    """``base hex  timestamps relative``: each time is the delta to the previous event, a frame or not (the
    statistics line's 0.3 s count).
    python-can 4.6 reads the mode and then takes every time as an offset from the start (time running back)."""
    path = tmp_path / f"{mode}.asc"
    path.write_text(f"date Mon Oct 25 19:00:55.020 2021\nbase hex  timestamps {mode}\ninternal events logged\n"
                    "Begin Triggerblock Mon Oct 25 19:00:55.020 2021\n"
                    "   0.000000 Start of measurement\n"
                    "   1.000000 1  123             Rx   d 1 11\n"
                    "   0.300000 1  Statistic: D 1 R 0 XD 0 XR 0 E 0 O 0 B 0.01%\n"
                    "   0.500000 1  124             Rx   d 1 22\n"
                    "   0.250000 1  125             Rx   d 1 33\n"
                    "End TriggerBlock\n", encoding="ascii")
    result = run_cli("capture", "--file", str(path), "--json")
    assert (result.code, result.data["warning_counts"]) == (0, {}), result.out
    start = datetime(2021, 10, 25, 19, 0, 55, 20000).timestamp()  # the trigger block's date: local time
    got = [event["payload"]["timestamp"] - start for event in result.data["events"]]
    assert got == pytest.approx(offsets, abs=1e-6)


_ASC_EVENTS = """date Mon Oct 25 19:00:55.020 2021
base hex  timestamps absolute
internal events logged
// version 9.0.0
Begin Triggerblock Mon Oct 25 19:00:55.020 2021
   0.000000 Start of measurement
   0.001000 1  123             Rx   d 2 11 22
   0.002000 1  Statistic: D 0 R 0 XD 0 XR 0 E 0 O 0 B 0.00%
   0.002500 CAN 1 Status:chip status error active
   0.002600 1  J1939TP FEE3p 6 0 0 - Rx d 23 00 01 02 03 04 05 06 07
   0.002700 SV: 1 0 1 ::Engine::Speed = 0
   0.003000 1  ErrorFrame
// a comment in the trigger block
   0.004000 1  1CFFFFFFx       Tx   r 8
End TriggerBlock
"""


def test_an_asc_file_s_events_and_comments_are_no_warnings(tmp_path):
    """The events the format defines besides frames (measurement start, statistics, chip status, J1939 transport,
    system variables, error frames) and comments are read without a warning."""
    path = tmp_path / "events.asc"
    path.write_text(_ASC_EVENTS, encoding="ascii")
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.code == 0 and result.data["warning_counts"] == {"CAPTURE_ERROR_FRAMES": 1}, result.out
    assert [event["payload"]["arbitration_id"] for event in result.data["events"]] == [0x123, 0x1CFFFFFF]


def test_a_malformed_asc_line_is_a_warning_with_its_line_and_the_read_goes_on(tmp_path):
    """python-can skips a line that is no header, frame or event without a word, and a frame line it cannot
    parse (an ID ``12G``) ends its read: canarchy warns about each, naming the line, and reads on."""
    lines = _ASC_EVENTS.splitlines(keepends=True)
    lines[7:7] = ["this line is garbage\n", "   0.001500 1  12G             Rx   d 2 11 22\n"]
    lines.insert(-1, "   0.005000 1  124             Rx   d 2 33 44\n")
    path = tmp_path / "damaged.asc"
    path.write_text("".join(lines), encoding="ascii")
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.code == 0, result.out
    assert [event["payload"]["arbitration_id"] for event in result.data["events"]] == [0x123, 0x1CFFFFFF, 0x124]
    assert result.data["warning_counts"] == {"ASC_LINE_MALFORMED": 2, "CAPTURE_ERROR_FRAMES": 1}
    assert result.data["warning_records"][:2] == [
        {"code": "ASC_LINE_MALFORMED", "file": str(path), "line": 8,
         "message": f"{path}:8: malformed .asc line: not a header, comment, frame or event line: "
                    "'this line is garbage'"},
        {"code": "ASC_LINE_MALFORMED", "file": str(path), "line": 9,
         "message": f"{path}:9: malformed .asc line: not a hex number: {lines[8].rstrip()!r}"},
    ]
    text = run_cli("capture", "--file", str(path), "--text")
    assert f"warning: {path}:8: malformed .asc line" in text.err and "ASC_LINE_MALFORMED 2" in text.err


def test_the_malformed_lines_of_an_asc_file_are_counted_and_the_first_ones_kept(tmp_path):
    path = tmp_path / "garbage.asc"
    path.write_text(_ASC_EVENTS + "garbage\n" * (MAX_PER_KIND * 20), encoding="ascii")
    capture = open_capture(path)
    assert len(list(capture)) == 2
    assert capture.log.counts["ASC_LINE_MALFORMED"] == capture.malformed_count == MAX_PER_KIND * 20
    assert len(capture.log.records) == MAX_PER_KIND + 1  # and the error frames' record
    assert capture.all_warnings()[-1].startswith(f"{MAX_PER_KIND * 19} more ASC_LINE_MALFORMED warning(s)")


def test_what_python_can_s_readers_log_is_a_warning_not_a_stray_line(tmp_path):
    """python-can logs what its readers skip or doubt (via ``logging``; with no handler, bare on stderr):
    a BLF object header version it does not know, an .asc CAN FD line whose DLC and length differ."""
    import struct

    whole = bytearray(_blf(tmp_path / "whole.blf", list(open_capture(LEAF))[:5], compression_level=0))
    inner = whole.index(b"LOBJ", _blf_objects(bytes(whole))[0] + 4)  # the container's first object
    struct.pack_into("<H", whole, inner + 6, 9)  # its header version
    (tmp_path / "version.blf").write_bytes(bytes(whole))
    (tmp_path / "dlc.asc").write_text(
        "date Mon Oct 25 19:00:55.020 2021\nbase hex  timestamps absolute\ninternal events logged\n"
        "Begin Triggerblock Mon Oct 25 19:00:55.020 2021\n"
        "   0.001000 CANFD   1 Rx 123  1 0 9 8 11 22 33 44 55 66 77 88 0 0 1000 0 0 0 0 0\n"
        "   0.002000 1  124             Rx   d 2 33 44\n", encoding="ascii")
    expected = {"version.blf": "version.blf: message 1: python-can's .blf reader: Unknown object header version (9)",
                "dlc.asc": "dlc.asc:5: python-can's .asc reader: DLC vs Data Length mismatch 9[12] != 8"}
    for name, text in expected.items():
        proc = subprocess.run([sys.executable, "-m", "canarchy", "capture", "--file", name, "--json"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
        data = json.loads(proc.stdout)["data"]
        assert data["warning_counts"] == {"CAPTURE_READER_WARNING": 1}
        assert data["warning_records"][0]["message"] == text


def test_a_broken_binary_file_is_a_decode_error_and_left_closed(tmp_path):
    """python-can's reader opens the file before it reads the header, and leaves it open when it rejects it."""
    path = tmp_path / "broken.blf"
    path.write_bytes(b"this is not a BLF file" * 10)
    with resource_warnings() as found:
        result = run_cli("capture", "--file", str(path), "--json")
    assert (result.code, result.error_codes) == (3, ["CAPTURE_FORMAT_INVALID"])
    assert found == []


# -- errors ------------------------------------------------------------------------------------


def test_missing_file_is_source_unavailable(tmp_path):
    with pytest.raises(TransportError) as info:
        open_capture(tmp_path / "nope.log")
    assert info.value.code == "CAPTURE_SOURCE_UNAVAILABLE" and info.value.exit_code == 2
    assert "does not exist" in info.value.message
    with pytest.raises(TransportError) as info:
        open_capture(tmp_path)  # a directory
    assert "is a directory" in info.value.message


@pytest.mark.parametrize("name", ["fifo.log", "-"])
def test_a_pipe_or_standard_input_is_named_as_such_not_as_missing(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    if name != "-":
        os.mkfifo(name)  # `candump -L can0 > fifo.log` in another shell: a stream, not a recording
    with pytest.raises(TransportError) as info:
        open_capture(name)
    assert info.value.code == "CAPTURE_SOURCE_UNAVAILABLE" and "does not exist" not in info.value.message
    assert ("standard input" if name == "-" else "not a regular file") in info.value.message
    assert "candump -L can0 > drive.log" in info.value.hint


def _canarchy(*argv: str, **options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "canarchy", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **options)


def test_a_candump_stream_on_standard_input_is_read_as_it_comes():
    """``candump -L can0 | canarchy capture --file - --jsonl``: each frame printed when its line arrives (not
    when the pipe ends), a bad line a warning naming its line, no traceback."""
    import select

    proc = _canarchy("capture", "--file", "-", "--jsonl", stdin=subprocess.PIPE)
    try:
        proc.stdin.write("(1.000000) can0 123#1122\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no frame printed while the stream is open"
        first = json.loads(proc.stdout.readline())
        assert (first["event_type"], first["payload"]["data"], first["source"]) == ("frame", "1122", "file:-")
        out, err = proc.communicate("garbage here\n(2.000000) can0 124#3344\n", timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert (proc.returncode, err) == (0, "")
    envelope = json.loads(out.splitlines()[-1])
    assert envelope["data"]["frame_count"] == 2 and envelope["data"]["format"] == "candump"
    assert envelope["warnings"] == ["-:2: malformed candump line: expected '(timestamp) channel ID#DATA', "
                                    "got 2 field(s): 'garbage here'"]


@pytest.mark.parametrize("name", ["-", "/dev/stdin"])
def test_the_decode_commands_read_standard_input(name):
    """``canarchy j1939 decode --file - < drive.log`` (or a pipe into ``/dev/stdin``) gives what the file gives."""
    with open(TRUCK, "rb") as source:
        proc = _canarchy("j1939", "decode", "--file", name, "--summary", "--json", stdin=source)
        out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, "")
    expected = run_cli("j1939", "decode", "--file", str(TRUCK), "--summary", "--json").data
    assert dict(json.loads(out)["data"], file=None) == dict(expected, file=None)


def test_a_named_pipe_is_read_as_candump_text_and_other_formats_on_a_pipe_are_refused(tmp_path, monkeypatch):
    """``mkfifo live.log; candump -L can0 > live.log`` in another shell: ``capture --file live.log`` reads it.
    A pipe named ``.asc`` is refused with what to do (python-can's readers need a file)."""
    import threading

    monkeypatch.chdir(tmp_path)
    os.mkfifo("live.log")
    lines = "(1.0) can0 123#11\n(2.0) can0 124#22\n"
    writer = threading.Thread(target=(tmp_path / "live.log").write_text, args=(lines,),
                              daemon=True)  # (blocked for good if nothing opens the pipe)
    writer.start()
    result = run_cli("capture", "--file", "live.log", "--json")
    writer.join(timeout=30)
    assert result.code == 0 and [e["payload"]["data"] for e in result.data["events"]] == ["11", "22"], result.out
    os.mkfifo("live.asc")
    result = run_cli("capture", "--file", "live.asc", "--json")
    assert (result.code, result.error_codes) == (1, ["CAPTURE_FORMAT_UNSUPPORTED"])
    assert "candump -l text" in result.envelope["errors"][0]["message"]


def test_unknown_suffix_is_unsupported(tmp_path):
    path = tmp_path / "capture.pcap"
    path.write_bytes(b"\x00")
    with pytest.raises(UserInputError) as info:
        open_capture(path)
    assert info.value.code == "CAPTURE_FORMAT_UNSUPPORTED" and ".log" in info.value.hint


# -- capture --file ----------------------------------------------------------------------------


def test_capture_file_json_reads_every_frame_by_default():
    result = run_cli("capture", "--file", str(LEAF), "--json")
    assert result.code == 0
    data = result.data
    assert data["frame_count"] == 221 and len(data["events"]) == 221
    assert (data["interface"], data["file"], data["format"]) == (None, str(LEAF), "candump")
    first = data["events"][0]
    assert first["event_type"] == "frame" and first["source"] == f"file:{LEAF}"
    assert first["payload"]["arbitration_id"] == 0x79B and first["payload"]["data"] == "022101ffffffffff"
    assert first["timestamp"] == 1641469561.9497


def test_capture_file_count_and_text():
    result = run_cli("capture", "--file", str(TRUCK), "--count", "2", "--text")
    assert result.code == 0
    assert result.out.splitlines() == ["(1635188455.020850)  can0  18F00E00   [8]  82 16 39 C4 FF FF FF FF",
                                       "(1635188455.021900)  can0  18FEDF00   [8]  82 FF FF FF 7D 09 02 01",
                                       f"capture of {TRUCK}: 2 frames"]


def test_capture_file_jsonl_streams_events_then_the_envelope(capsys):
    code = main(["capture", "--file", str(LEAF), "--jsonl"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and len(lines) == 222
    assert all(json.loads(line)["event_type"] == "frame" for line in lines[:-1])
    closing = json.loads(lines[-1])
    assert closing["ok"] is True and closing["data"]["frame_count"] == 221 and "events" not in closing["data"]


def test_capture_file_needs_no_channel_even_with_a_default_configured():
    write_user_config('[transport]\ndefault_interface = "vcan7"\n')
    result = run_cli("capture", "--file", str(LEAF), "--count", "1", "--json")
    assert result.code == 0 and result.data["frame_count"] == 1 and result.data["interface"] is None


def test_capture_file_and_a_channel_conflict():
    result = run_cli("capture", "can0", "--file", str(LEAF), "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_ARGUMENTS"])


def test_capture_file_errors_through_the_cli(tmp_path):
    missing = run_cli("capture", "--file", str(tmp_path / "missing.log"), "--json")
    assert (missing.code, missing.error_codes) == (2, ["CAPTURE_SOURCE_UNAVAILABLE"])
    (tmp_path / "x.pcapng").write_bytes(b"")
    unknown = run_cli("capture", "--file", str(tmp_path / "x.pcapng"), "--json")
    assert (unknown.code, unknown.error_codes) == (1, ["CAPTURE_FORMAT_UNSUPPORTED"])
    assert all(e["hint"] for e in missing.envelope["errors"] + unknown.envelope["errors"])


def test_capture_file_warnings_reach_the_envelope(tmp_path):
    path = tmp_path / "bad.log"
    path.write_text(_lines(LEAF)[0] + "\nnot a frame\n" + _lines(LEAF)[1] + "\n", encoding="ascii")
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.code == 0 and result.data["frame_count"] == 2
    assert result.envelope["warnings"] == [f"{path}:2: malformed candump line: timestamp is not in parentheses: "
                                           f"'not a frame'"]
    path.write_text(_lines(LEAF)[0] + "\n(1.0) can0 123#0102030405060708FF\n", encoding="ascii")
    shown = run_cli("capture", "--file", str(path), "--json").envelope["warnings"]  # the reason's own full stop
    assert shown == [f"{path}:2: malformed candump line: 9 data bytes do not fit a classic CAN frame: "
                     "'(1.0) can0 123#0102030405060708FF'"], shown


def test_reading_candump_does_not_import_python_can():
    code = ("import sys, io; from canarchy.cli import main; "
            f"main(['capture', '--file', {str(LEAF)!r}, '--json'], stdout=io.StringIO()); "
            "print('can' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


def test_capturefile_can_be_iterated_twice():
    capture = CaptureFile(str(LEAF), "candump")
    assert len(list(capture)) == len(list(capture)) == 221
    assert capture.frame_count == 221


def test_capture_file_jsonl_streams_into_the_given_stdout(capsys):
    import io

    out = io.StringIO()
    code = main(["capture", "--file", str(LEAF), "--count", "3", "--jsonl"], stdout=out)
    assert code == 0 and len(out.getvalue().splitlines()) == 4
    assert capsys.readouterr().out == ""


# -- the fast candump path builds the same frames ----------------------------------------------


def test_checked_frames_are_canframes_equal_to_validated_ones():
    import dataclasses

    from canarchy.frames import CanFrame

    assert tuple(f.name for f in dataclasses.fields(CanFrame)) == candump.CHECKED_FRAME_FIELDS
    for line, expected in [
        ("(1.5) can0 18F00E00#821639C4FFFFFFFF", CanFrame(0x18F00E00, bytes.fromhex("821639C4FFFFFFFF"), True,
                                                          False, False, 1.5, "can0")),
        ("(2.0) vcan1 7FF#", CanFrame(0x7FF, b"", False, False, False, 2.0, "vcan1")),
        ("(3.0) can1 123##1" + "ab" * 64, CanFrame(0x123, b"\xab" * 64, False, True, False, 3.0, "can1",
                                                   bitrate_switch=True)),
        ("(3.5) can1 1F334455##3" + "01" * 12, CanFrame(0x1F334455, b"\x01" * 12, True, True, False, 3.5, "can1",
                                                        bitrate_switch=True, error_state_indicator=True)),
        ("(4.0) can0 123##0", CanFrame(0x123, b"", False, True, False, 4.0, "can0")),
    ]:
        frame = parse_candump_line(line)
        assert type(frame) is CanFrame and frame == expected and frame.dlc == expected.dlc
        assert frame.to_payload() == expected.to_payload() and hash(frame) == hash(expected)


@pytest.mark.parametrize("line", ["(1.0) can0 800#00", "(1.0) can0 5FFFFFFF#00", "(1.0) can0 123#" + "00" * 9,
                                  "(1.0) can0 123##1" + "00" * 9, "(1.0) can0 123##1" + "00" * 65])
def test_the_fast_path_still_refuses_what_no_frame_carries(line):
    with pytest.raises(UserInputError) as info:
        parse_candump_line(line)
    assert info.value.code == "INVALID_FRAME"


#: Lines of the common shape (each matches candump.COMMON_LINE) that the reader must still judge
#: as parse_candump_line does: IDs seen before with data no such frame carries, odd data, error
#: frames, IDs of other widths or out of range, CAN FD flags, direction suffixes, other channels.
TRICKY_COMMON = [
    "(1700000000.000000) can0 18F00E00#821639C4FFFFFFFF",
    "(1700000000.000001) can0 18F00E00#821639C4FFFFFFFF R",
    "(1700000000.000002) can0 18F00E00#821639C4FFFFFFFF t",
    "(1700000000.000003) can0 18F00E00#8216",
    "(1700000000.000004) can0 18F00E00#",
    "(1700000000.000005) can0 18F00E00#821639C4FFFFFFFF00",
    "(1700000000.000006) can0 18F00E00#821",
    "(1700000000.000007) can1 18F00E00#01",
    "(1700000000.000008) can0 18f00e00#01",
    "(1700000000.000009) can0 7E0#0201",
    "(1700000000.000010) can0 7e0#0201",
    "(1700000000.000011) can0 7E0#02010000000000000000",
    "(1700000000.000011) can0 7E0#" + "01" * 12,
    "(1700000000.000011) can0 18F00E00#" + "01" * 64,
    "(1700000000.000012) can0 800#00",
    "(1700000000.000013) can0 5FFFFFFF#00",
    "(1700000000.000014) can0 20000080#0000000000000000",
    "(1700000000.000015) can0 20000080#0000000000000000",
    "(1700000000.000016) can0 1234#00",
    "(1700000000.000017) can0 1234567#00",
    "(1700000000.000018) can1 123##1" + "ab" * 64,
    "(1700000000.000019) can1 123##1" + "ab" * 12,
    "(1700000000.000020) can1 123##1" + "ab" * 9,
    "(1700000000.000021) can1 123##1" + "ab" * 66,
    "(1700000000.000022) can1 123##3" + "01" * 8,
    "(1700000000.000023) can1 123##0",
    "(1700000000.000024) can1 123##F0102",
    "(1700000000.000025) can1 123#0102",
    "(1700000000.000026) can1 123##1abc",
    "(0.000027) can0 7E0#0201",
    "(1.5) can0 7E0#0201",
    "(1700000000.000029) vcan%d\\\"x 7E0#0201 T",
    "(1700000000.000030) c\ufffdn0 7E0#0201",
]
#: Lines of other shapes: each sends its batch down the line-by-line path.
TRICKY_OTHER = [
    "", "   ", "garbage", "(1700000000.000100) can0 7E0#R", "(1700000000.000101) can0 7E0#R4",
    "(1700000000.000102) can0 20000080#R", "(1700000000.000103) can0 7E0#RX", "(00.5) can0 7E0#00",
    "(1700000000.) can0 7E0#00", "(.5) can0 7E0#00", "(1700000000) can0 7E0#00", "(1_7.5) can0 7E0#00",
    "(nan) can0 7E0#00", "(\u0661.5) can0 7E0#00", "(1.5 can0 7E0#00", "(1.5)  can0   7E0#0201  ",
    "(1.5)\tcan0\t7E0#0201", "(1.5) can0 7E0#0201 X", "(1.5) can0 7E0#02 01", "(1.5) can0 7E0#0201\x1c",
    "(1.5) can0 7E0#0201\u00a0", "(1.5) can0 7E0-0201", "(1.5) can0 12G#00", "(1.5) can0 123##",
    "(1.5) can0 123##G00",
]


def _line_by_line(path: Path) -> tuple[list[dict], list[str], tuple[int, int, int]]:
    """What reading ``path`` one line at a time with parse_candump_line gives (the reference for
    the reader's fast path): the frames' ``__dict__``, the warnings, and the counts."""
    frames, warnings, malformed, error_frames = [], [], 0, 0
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        for number, line in enumerate(handle, 1):
            try:
                frame = parse_candump_line(line)
            except candump.ErrorFrame:
                error_frames += 1
                continue
            except (ValueError, UserInputError) as exc:
                malformed += 1
                warnings.append(f"{path}:{number}: malformed candump line: {capture_file._why(exc)}: "
                                f"{capture_file._shown(line)}")
                continue
            if frame is not None:
                frames.append(dict(frame.__dict__))
    if error_frames:
        warnings.append(f"{path}: {error_frames} error frame(s) (CAN_ERR_FLAG) skipped")
    return frames, warnings, (number, malformed, error_frames)


def _read(path: Path) -> tuple[list[dict], list[str], tuple[int, int, int]]:
    """What the reader gives: the frames' ``__dict__``, every warning, the counts."""
    capture = open_capture(path)
    frames = [dict(frame.__dict__) for frame in capture]
    return frames, capture.all_warnings(), (capture.line_count, capture.malformed_count, capture.error_frame_count)


@pytest.fixture
def every_warning(monkeypatch):
    """The reader's warning log keeps every warning (not the first 50 of each kind)."""
    from canarchy.warning_log import WarningLog

    monkeypatch.setattr(capture_file, "WarningLog", lambda: WarningLog(per_kind=10**9))


def _corpus(path: Path, lines: list[str]) -> Path:
    endings = ("\n", "\r\n", "\n", "\n", "\r\n")
    path.write_text("".join(line + endings[i % 5] for i, line in enumerate(lines)), encoding="utf-8", newline="")
    return path


def test_the_corpus_of_common_lines_has_the_common_shape():
    assert len(candump.common_lines("\n".join(TRICKY_COMMON) + "\n")) == len(TRICKY_COMMON)
    assert not any(candump.common_line(line) for line in TRICKY_OTHER)


def test_whole_batches_of_common_lines_read_as_line_by_line(tmp_path, every_warning):
    """Every batch matches the common shape at once: the batch path judges each tricky line."""
    lines = TRICKY_COMMON * (3 * capture_file.BATCH_LINES // len(TRICKY_COMMON) + 1)
    path = _corpus(tmp_path / "common.log", lines)
    text = path.read_text(encoding="utf-8")
    assert len(candump.common_lines(text)) == len(lines)  # no line leaves the batch path
    got = _read(path)
    assert got == _line_by_line(path)
    assert got[0] and got[1] and got[2][1] and got[2][2]  # frames, warnings, malformed lines, error frames


def test_batches_with_other_lines_read_as_line_by_line(tmp_path, every_warning):
    """A few uncommon lines among common ones: those batches go line by line, both paths mixed."""
    lines = []
    for i in range(3 * capture_file.BATCH_LINES):
        lines.append(TRICKY_COMMON[i % len(TRICKY_COMMON)])
        if i % 97 == 0:
            lines.append(TRICKY_OTHER[i // 97 % len(TRICKY_OTHER)])
    lines += TRICKY_OTHER
    path = _corpus(tmp_path / "mixed.log", lines)
    assert _read(path) == _line_by_line(path)


def test_random_lines_read_as_line_by_line(tmp_path, every_warning):
    """Lines put together from good and bad parts, at random (seeded): reader == reference."""
    import random

    rng = random.Random(20261201)
    stamps = ["(1700000000.000001)", "(0.5)", "(12.000)", "(01.5)", "(1.)", "(x)", "1.5", "(1e3)"]
    channels = ["can0", "can1", "vcan0", "c#n"]
    ids = ["123", "7FF", "7ff", "800", "18F00E00", "1FFFFFFF", "2FFFFFFF", "20000080", "12", "1234", "12G"]
    datas = ["#", "#00", "#0011223344556677", "#001122334455667788", "#0", "#R", "#R8", "##1", "##2" + "00" * 12,
             "##3" + "00" * 9, "##0" + "00" * 64, "##1" + "00" * 65, "#ZZ"]
    tails = ["", "", "", " R", " T", " X", "  ", "\t"]
    lines = [f"{rng.choice(stamps)} {rng.choice(channels)} {rng.choice(ids)}{rng.choice(datas)}{rng.choice(tails)}"
             for _ in range(5 * capture_file.BATCH_LINES)]
    path = _corpus(tmp_path / "random.log", lines)
    got = _read(path)
    assert got == _line_by_line(path)
    assert len(got[0]) > 100 and len(got[1]) > 100


def test_the_fast_path_parses_each_channel_and_id_once(tmp_path, monkeypatch):
    calls = []
    real = capture_file.parse_candump_line
    monkeypatch.setattr(capture_file, "parse_candump_line", lambda line: calls.append(line) or real(line))
    lines = [f"(1700000000.{i:06d}) can{i % 2} {'7E0' if i % 3 else '18DAF110'}#{i % 256:02X}" for i in range(2000)]
    frames = list(open_capture(_corpus(tmp_path / "ids.log", lines)))
    assert len(frames) == 2000 and len(calls) == 4  # two channels, two IDs
    assert frames[1999].data == bytes([1999 % 256]) and frames[1999].timestamp == 1700000000.001999


def test_the_known_ids_are_bounded_and_the_frames_the_same(tmp_path, monkeypatch, every_warning):
    monkeypatch.setattr(capture_file, "MAX_KNOWN_IDS", 3)
    lines = [f"(1700000000.{i:06d}) can0 {i % 10:03X}#{i % 256:02X}" for i in range(1000)]
    path = _corpus(tmp_path / "many.log", lines)
    assert _read(path) == _line_by_line(path)


def test_damage_reads_the_lines_before_it_as_line_by_line(tmp_path, every_warning):
    """A cut .gz: the frames and warnings before the damage are those of reading line by line."""
    lines = TRICKY_COMMON * 40 + _lines(TRUCK)
    whole = gzip.compress(("\n".join(lines) + "\n").encode("utf-8"))
    path = tmp_path / "cut.log.gz"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    expected, warnings, read = [], [], 0
    with gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="") as handle:
        try:
            for line in handle:
                read += 1
                try:
                    frame = parse_candump_line(line)
                except (ValueError, UserInputError, candump.ErrorFrame):
                    continue
                if frame is not None:
                    expected.append(dict(frame.__dict__))
        except EOFError:
            pass
    frames, warnings, (line_count, _, _) = _read(path)
    assert frames == expected and line_count == read
    assert f"{path}:{read + 1}: reading stopped:" in "\n".join(warnings)


def test_a_reader_stopped_early_counts_what_it_gave(tmp_path):
    path = _corpus(tmp_path / "early.log", _lines(TRUCK) * 2)
    capture = open_capture(path)
    frames = iter(capture)
    for _ in range(capture_file.BATCH_LINES + 5):
        next(frames)
    frames.close()
    assert capture.frame_count == capture.line_count == capture_file.BATCH_LINES + 5


# -- bad input: one code and exit status per kind, in every format -------------------------------


def _documented_errors() -> dict[str, tuple[str, int]]:
    """``{code: (class, exit)}`` from the error table of docs/decoding.md."""
    text = (Path(__file__).parent.parent / "docs" / "decoding.md").read_text(encoding="utf-8")
    table = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].isdigit():
            rows[cells[0]] = (cells[1], int(cells[2]))
    return rows


def test_the_documented_error_table_matches_the_code():
    import re

    from canarchy import errors

    documented = _documented_errors()
    source = Path(capture_file.__file__).read_text(encoding="utf-8")
    raised = set(re.findall(r'Error\(\s*"(CAPTURE_[A-Z_]+)"', source))
    assert raised and raised <= set(documented), raised - set(documented)
    for code, (class_name, exit_code) in documented.items():
        assert getattr(errors, class_name).exit_code == exit_code, code


def _write(path: Path, kind: str) -> Path:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "blank":
        path.write_text("\n  \n\n", encoding="ascii")
    elif kind == "garbage":
        path.write_bytes(bytes(range(256)) * 8)
    elif kind == "text":
        path.write_text("hello world\nthis is not a capture\n", encoding="ascii")
    elif kind == "not-gzip":
        path.write_text("(1.0) can0 123#01\n", encoding="ascii")
    elif kind == "empty-gzip":
        path.write_bytes(gzip.compress(b""))
    elif kind == "broken-gzip":
        path.write_bytes(gzip.compress(LEAF.read_bytes())[:30])
    return path


BAD_INPUTS = [(suffix, kind, code) for suffix in (".log", ".asc", ".trc", ".csv", ".blf", ".db")
              for kind, code in (("empty", "CAPTURE_EMPTY"), ("garbage", "CAPTURE_FORMAT_INVALID"))] + [
    (".log", "blank", "CAPTURE_EMPTY"), (".asc", "blank", "CAPTURE_EMPTY"),
    (".log", "text", "CAPTURE_FORMAT_INVALID"), (".asc", "text", "CAPTURE_FORMAT_INVALID"),
    (".trc", "text", "CAPTURE_FORMAT_INVALID"), (".csv", "text", "CAPTURE_FORMAT_INVALID"),
] + [(suffix, kind, code) for suffix in (".log.gz", ".asc.gz", ".blf.gz")
     for kind, code in (("not-gzip", "CAPTURE_COMPRESSION_INVALID"), ("broken-gzip", "CAPTURE_COMPRESSION_INVALID"),
                        ("empty-gzip", "CAPTURE_EMPTY"))]


@pytest.mark.parametrize("suffix, kind, code", BAD_INPUTS)
def test_empty_garbage_and_wrongly_compressed_inputs_are_errors(tmp_path, suffix, kind, code):
    path = _write(tmp_path / f"capture{suffix}", kind)
    exit_code = _documented_errors()[code][1]
    for fmt in ("--json", "--jsonl"):
        result = run_cli("capture", "--file", str(path), fmt)
        envelope = json.loads(result.out)  # --jsonl: the error envelope is the only line
        assert (result.code, [e["code"] for e in envelope["errors"]]) == (exit_code, [code]), result.out
        assert envelope["errors"][0]["hint"] and envelope["data"] == {}
    decoded = run_cli("isotp", "decode", "--file", str(path), "--json")
    assert (decoded.code, decoded.error_codes) == (exit_code, [code])


def test_a_file_of_error_frames_only_is_read_not_refused(tmp_path):
    path = tmp_path / "errors.log"
    path.write_text("(1.0) can0 20000080#0000000000000000\n", encoding="ascii")
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.code == 0 and result.data["frame_count"] == 0
    assert result.data["warning_counts"] == {"CAPTURE_ERROR_FRAMES": 1}


def test_damage_after_the_first_frame_is_a_warning(tmp_path):
    path = tmp_path / "cut.log.gz"
    whole = gzip.compress(TRUCK.read_bytes())
    path.write_bytes(whole[: len(whole) // 2])
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.code == 0 and 0 < result.data["frame_count"] < 3582
    assert result.data["warning_counts"] == {"CAPTURE_READ_STOPPED": 1}


def test_mf4_without_asammdf_is_unsupported_with_a_true_hint(tmp_path, monkeypatch):
    real = capture_file.importlib.util.find_spec
    monkeypatch.setattr(capture_file.importlib.util, "find_spec",
                        lambda name, *a: None if name == "asammdf" else real(name, *a))
    path = tmp_path / "capture.mf4"
    path.write_bytes(b"MDF     4.10    ")
    result = run_cli("capture", "--file", str(path), "--json")
    assert (result.code, result.error_codes) == (1, ["CAPTURE_FORMAT_UNSUPPORTED"])
    assert "asammdf" in result.envelope["errors"][0]["hint"]


def test_can_fd_frames_survive_asc_and_csv(tmp_path):
    """python-can's ASC reader calls a CAN FD frame without data a remote frame (CAN FD has none), and
    its CSV files have no FD flag: the frames still read back as written, the CSV's longer than 8 bytes
    as CAN FD (none is dropped as a classic frame that cannot hold its data)."""
    source = tmp_path / "fd.log"
    source.write_text("(1700000000.000000) can1 456##0\n(1700000000.100000) can1 456##1000102030405060708090A0B\n"
                      "(1700000000.200000) can0 123#R4\n(1700000000.300000) can0 123#11\n")
    expected = [(f.arbitration_id, f.is_fd, f.is_remote_frame, f.dlc, f.data) for f in open_capture(source)]
    for suffix in (".asc", ".csv"):
        target = tmp_path / f"fd{suffix}"
        result = run_cli("capture", "--file", str(source), "--output", str(target), "--json")
        assert result.code == 0, result.out
        capture = open_capture(target)
        got = [(f.arbitration_id, f.is_fd, f.is_remote_frame, f.dlc, f.data) for f in capture]
        if suffix == ".csv":  # no FD flag: a CAN FD frame without data reads back as a classic one
            expected[0] = (0x456, False, False, 0, b"")
        assert got == expected, suffix
        assert capture.log.to_data()["warning_counts"] == {}


@pytest.mark.parametrize("suffix", [".log", ".asc", ".blf", ".trc", ".csv"])
def test_the_direction_of_each_frame_survives_a_conversion(tmp_path, suffix):
    """candump's `` T`` (sent by the recorder) and `` R``: read, and written back where the format can say it
    (python-can's writers take ``is_rx``); a .csv file cannot, and the conversion says so."""
    source = tmp_path / "both.log"
    source.write_text("(1700000000.000000) can0 7E0#02010D00 T\n(1700000000.010000) can0 7E8#03410D32 R\n"
                      "(1700000000.020000) can0 7E0#02010D00 T\n(1700000000.030000) can0 7DF#0201\n"
                      "(1700000000.040000) can0 7E0#R2 T\n")
    directions = [frame.is_rx for frame in open_capture(source)]
    assert directions == [False, True, False, True, False]
    out = tmp_path / f"converted{suffix}"
    result = run_cli("capture", "--file", str(source), "--output", str(out), "--json")
    back = [frame.is_rx for frame in open_capture(out)]
    if suffix == ".csv":
        assert back == [True] * 5 and "3 frame(s) were sent (T)" in " ".join(result.envelope["warnings"])
    else:
        assert back == (directions[:4] if suffix == ".trc" else directions)  # .trc: no remote frames


# -- timestamps a recording cannot hold ---------------------------------------------------------

_STAMPS = "\n".join(f'{{"event_type": "frame", "payload": {{"arbitration_id": 1, "data": "0{n}", "timestamp": {t}}}}}'
                    for n, t in enumerate(("1e400", "NaN", "1e30", "-1", "5")))


@pytest.mark.parametrize(("name", "content", "kept", "code", "lines"), [
    # candump: the second line of an ID takes the reader's fast path, the first the full parser
    ("y11k.log", "(300000000000.000000) can0 123#01\n(1.000000) can0 123#02\n"
                 "(300000000000.000000) can0 123#03\n(253402300799.000000) can0 123#04\n",
     ["02", "04"], "CANDUMP_LINE_MALFORMED", [1, 3]),
    ("t.jsonl", _STAMPS + "\n", ["04"], "CAPTURE_EVENT_INVALID", [1, 2, 3, 4]),
    ("t.csv", "timestamp,arbitration_id,extended,remote,error,dlc,data\n"
              "300000000000.0,0x123,0,0,0,1,AQ==\n1.5,0x123,0,0,0,1,Ag==\n", ["02"], "CAPTURE_FRAME_INVALID", None),
], ids=["candump", "json", "python-can-reader"])
def test_timestamps_a_recording_cannot_hold_are_refused_line_by_line(tmp_path, name, content, kept, code, lines):
    # not finite, negative, or past the year 9999 (what BLF and datetime can hold)
    path = tmp_path / name
    path.write_text(content)
    result = run_cli("capture", "--file", str(path), "--json")
    assert result.code == 0 and [e["payload"]["data"] for e in result.data["events"]] == kept, result.out
    assert result.data["warning_counts"] == {code: len(lines or [1])}
    assert "year 9999" in result.data["warning_records"][-1]["message"]
    if lines:
        assert [r["line"] for r in result.data["warning_records"]] == lines
    text = run_cli("capture", "--file", str(path), "--text").out
    assert "(nan)" not in text and "(inf)" not in text


def _frame_events(tmp_path: Path, payloads: list[str]) -> Path:
    """A ``.jsonl`` of one frame event per line, each payload given as the JSON text inside its braces."""
    events = tmp_path / "t.jsonl"
    events.write_text("".join(f'{{"event_type": "frame", "payload": {{{p}}}}}\n' for p in payloads))
    return events


def test_json_frame_fields_of_the_wrong_type_are_invalid_events(tmp_path):
    # what canarchy writes: true/false flags, whole numbers, a dlc that matches the data
    events = _frame_events(tmp_path, [
        '"arbitration_id": 291, "data": "0102", "dlc": 2', '"arbitration_id": 291, "data": "0102", "is_fd": "yes"',
        '"arbitration_id": 291.5, "data": "01"', '"arbitration_id": true, "data": "01"',
        '"arbitration_id": 291, "data": "0102", "dlc": 5', '"arbitration_id": 291, "is_remote_frame": 1'])
    result = run_cli("capture", "--file", str(events), "--json")
    assert result.code == 0 and result.data["frame_count"] == 1, result.out
    assert [r["line"] for r in result.data["warning_records"]] == [2, 3, 4, 5, 6]
    assert "not true or false" in result.data["warning_records"][0]["message"]
    assert "does not match the 2 data byte(s)" in result.data["warning_records"][3]["message"]




def test_a_conversion_reads_no_setting_so_a_broken_config_does_not_stop_it():
    """`capture --file` opens no bus and uses no setting, as `decode --file`: a config.toml that does not parse
    stopped it (CONFIG_INVALID) while decode ran. It runs; the commands that open a bus still refuse it."""
    write_user_config("[transport\nbroken")
    result = run_cli("capture", "--file", str(TRUCK), "--count", "1", "--json")
    assert result.code == 0 and result.data["frame_count"] == 1, result.out
    assert run_cli("capture", "--count", "1", "--json").error_codes == ["CONFIG_INVALID"]
