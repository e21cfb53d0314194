"""canarchy.capture_stats and ``capture --file PATH --summary``: per-ID counts and rates of the real recordings,
checked against figures computed here from the log text."""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import itertools
from collections import defaultdict
from pathlib import Path

from canarchy.capture_stats import CaptureStats
from canarchy.capture_file import open_capture
from tests.helpers import run_cli

CAPTURES = Path(__file__).parent.parent / "fixtures" / "captures"
TRUCK = CAPTURES / "j1939_truck_idle.log"


def per_id(path: Path) -> dict[str, list[float]]:
    stamps: dict[str, list[float]] = defaultdict(list)
    for line in path.read_text().splitlines():
        stamp, _channel, body = line.split()
        stamps[body.split("#")[0]].append(float(stamp[1:-1]))
    return stamps


def test_counts_and_rates_match_the_log_text():
    expected = per_id(TRUCK)
    stats = CaptureStats()
    for frame in open_capture(str(TRUCK)):
        stats.feed(frame)
    data = stats.to_dict()
    assert data["frame_count"] == sum(len(v) for v in expected.values()) == 3582
    assert [row["id"] for row in data["ids"]] == sorted(expected)  # all 29-bit here: sorted by ID
    for row in data["ids"]:
        stamps = expected[row["id"]]
        assert row["count"] == len(stamps)
        if len(stamps) > 1:
            assert row["rate_hz"] == round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 3)
            assert row["min_gap_s"] == round(min(b - a for a, b in itertools.pairwise(stamps)), 6)
        assert row["first_s"] == round(stamps[0] - min(min(v) for v in expected.values()), 6)


def test_capture_file_summary_command():
    result = run_cli("capture", "--file", str(CAPTURES / "obd2_skoda_7e0_7e8.log"), "--summary", "--json")
    assert result.code == 0, result.out
    data = result.data
    assert (data["frame_count"], data["id_count"], data["summary"]) == (3854, 2, True)
    assert "events" not in data
    assert [(row["id"], row["is_extended_id"]) for row in data["ids"]] == [("7E0", False), ("7E8", False)]
    text = run_cli("capture", "--file", str(TRUCK), "--summary").out
    assert text.splitlines()[0].endswith("3582 frames, 45 IDs over 9.999 s")
    assert any(line.split()[:2] == ["0CF00400", "1000"] for line in text.splitlines())


def test_summary_needs_a_file():
    result = run_cli("capture", "vcan0", "--summary", "--json")
    assert (result.code, result.error_codes) == (1, ["INVALID_ARGUMENTS"])


def test_a_summary_lists_the_first_ids_and_counts_the_frames_of_the_rest(tmp_path):
    """A random-ID or fuzzed capture has nearly one ID a frame: the summary keeps statistics of the first MAX_IDS
    distinct IDs and counts the frames of any other (memory bounded), saying so in a warning and in its text."""
    from canarchy.capture_stats import MAX_IDS

    extra = 5
    lines = [f"({i / 1000:.6f}) can0 {i:08X}#00" for i in range(MAX_IDS + extra)]
    lines += [f"(9.000000) can0 {MAX_IDS + 1:08X}#01", "(9.100000) can0 00000000#02"]  # one of each, again
    source = tmp_path / "many-ids.log"
    source.write_text("\n".join(lines) + "\n")
    result = run_cli("capture", "--file", str(source), "--summary", "--json")
    assert result.code == 0, result.out
    data = result.data
    assert (data["frame_count"], data["id_count"], data["unlisted_frame_count"]) == (MAX_IDS + extra + 2, MAX_IDS,
                                                                                       extra + 1)
    assert len(data["ids"]) == MAX_IDS and data["ids"][0]["count"] == 2  # 00000000 listed, seen twice
    assert [(w["code"], w["count"]) for w in data["warning_records"]] == [("CAPTURE_IDS_UNLISTED", extra + 1)]
    assert any(f"past the first {MAX_IDS} distinct IDs" in w for w in result.envelope["warnings"])
    text = run_cli("capture", "--file", str(source), "--summary").out
    assert f"{MAX_IDS} IDs over 9.100 s ({extra + 1} frames of further IDs not listed)" in text.splitlines()[0]
