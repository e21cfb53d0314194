"""``fuzz guided`` and canarchy.fuzz: campaigns against a real simulated ECU.

Active tests run a :class:`canarchy.simulator.SimulatedEcu` on python-can's
``virtual`` bus (one channel per test) and point canarchy at it with
``CANARCHY_PYTHON_CAN_INTERFACE=virtual`` and the channel on the command line.
``ecu.requests`` is what actually crossed the bus.
"""

from __future__ import annotations

import canarchy.testing.required  # noqa: F401  (no test here runs without the isolation)

import json
import re
from pathlib import Path

import pytest

from canarchy import fuzz, fuzz_inputs
from canarchy.simulator import SimulatedEcu
from canarchy.frames import CanFrame
from tests.helpers import open_slowly, recorded, run_cli

FAST = ("--rate", "10000", "--timeout", "0.2")
FINDING_NAME = re.compile(r"^finding-(\d{8})\.json$")
SEND_KEY = bytes.fromhex("0627020000000000")  # SecurityAccess sendKey, a wrong key


@pytest.fixture(autouse=True)
def virtual_transport(monkeypatch):
    """canarchy's python-can backend opens ``virtual`` buses in this module."""
    monkeypatch.setenv("CANARCHY_PYTHON_CAN_INTERFACE", "virtual")


@pytest.fixture
def ecu(virtual_channel):
    with SimulatedEcu(channel=virtual_channel) as running:
        yield running


def fuzz_cli(channel: str | None, *options: str):
    argv = ["fuzz", "guided"] + ([channel] if channel else []) + ["--id", "0x7E0", *options, "--json"]
    return run_cli(*argv)


def campaign_files(campaign_dir: Path) -> list[str]:
    return sorted(p.name for p in campaign_dir.iterdir())


# -- a campaign -------------------------------------------------------------------------

def test_campaign_finds_security_access_markers(ecu, virtual_channel, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "send-key.bin").write_bytes(SEND_KEY)
    result = fuzz_cli(virtual_channel, "--max-iterations", "30", "--seed", "5", *FAST,
                      "--corpus", str(corpus), "--findings-dir", str(tmp_path / "findings"))
    assert result.code == 0, result.out
    data = result.data
    assert {"positive:67", "nrc:27:35", "nrc:27:36"} <= set(data["markers"])
    assert data["markers"] == sorted(data["markers"])
    assert data["iterations"] == data["frames_sent"] == 30 == len(ecu.requests)
    assert data["stopped_reason"] == "max_iterations"
    # the baseline goes first: the seed payload, then the corpus entry, unmutated
    assert ecu.requests[:2] == [fuzz.DEFAULT_SEED_DATA, SEND_KEY]


def test_findings_layout_is_as_specified(ecu, virtual_channel, tmp_path):
    root = tmp_path / "findings"
    result = fuzz_cli(virtual_channel, "--max-iterations", "25", "--seed", "3", *FAST, "--findings-dir", str(root))
    assert result.code == 0, result.out
    data = result.data
    campaign_dir = root / data["campaign_id"]
    assert data["findings_dir"] == str(campaign_dir)
    assert [p.name for p in root.iterdir()] == [data["campaign_id"]]
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", data["campaign_id"])

    names = campaign_files(campaign_dir)
    assert names[0] == "campaign.json" and all(FINDING_NAME.match(n) for n in names[1:])  # no temp files left
    campaign = json.loads((campaign_dir / "campaign.json").read_text())
    assert campaign["status"] == "finished"
    assert campaign["campaign_id"] == data["campaign_id"]
    assert campaign["frames_sent"] == 25 and campaign["seed"] == 3 and campaign["seed_data"] == "022701"
    assert campaign["findings_count"] == data["findings_count"] == len(names) - 1 == len(data["events"])
    assert campaign["markers"] == data["markers"]

    new_classes = set()
    findings = [e for e in data["events"] if e["event_type"] == "fuzz_finding"]
    assert len(findings) == len(names) - 1
    for event, name in zip(findings, names[1:], strict=True):
        finding = json.loads((campaign_dir / name).read_text())
        iteration = int(FINDING_NAME.match(name).group(1))
        assert finding["iteration"] == iteration == event["payload"]["iteration"]
        assert event["payload"]["path"] == str(campaign_dir / name)
        assert bytes.fromhex(finding["data"]) == ecu.requests[iteration]   # what was really sent
        assert finding["new_classes"] and not new_classes & set(finding["new_classes"])
        assert set(finding["new_classes"]) <= set(finding["response_classes"])
        assert all(c.startswith(finding["request_shape"] + " ") for c in finding["response_classes"])
        assert set(finding["new_markers"]) <= set(finding["markers"]) <= set(data["markers"])
        new_classes |= set(finding["new_classes"])
    assert sorted(new_classes) == data["classes"] == campaign["classes"]


def test_same_seed_same_payload_sequence(virtual_channel, tmp_path):
    # A generous timeout and slow threshold: a scheduling hiccup must not add a marker (markers steer the corpus);
    # every request of seed 56 is answered, so the wait ends with the answer.
    options = ("--max-iterations", "16", "--seed", "56", "--rate", "10000",
               "--timeout", "2", "--slow-threshold", "2")
    sequences = []
    for run in range(2):
        with SimulatedEcu(channel=virtual_channel) as ecu:
            result = fuzz_cli(virtual_channel, *options, "--findings-dir", str(tmp_path / f"run{run}"))
        assert result.code == 0, result.out
        sequences.append(list(ecu.requests))
    assert sequences[0] == sequences[1]
    assert len(set(sequences[0])) > 8   # it did mutate
    with SimulatedEcu(channel=virtual_channel) as ecu:
        fuzz_cli(virtual_channel, *options[:2], "--seed", "57", *options[4:],
                 "--findings-dir", str(tmp_path / "other"))
    assert ecu.requests != sequences[0]
    plan = fuzz_cli(None, "--dry-run", "--seed", "56").data["planned_payloads"]
    # the plan is exact until a mutated input grows the corpus: always for the first two
    assert [bytes.fromhex(p) for p in plan[:2]] == sequences[0][:2]


def test_max_seconds_stops_the_campaign(ecu, virtual_channel, tmp_path):
    result = fuzz_cli(virtual_channel, "--max-iterations", "100000", "--max-seconds", "1", "--rate", "20",
                      "--timeout", "0.05", "--findings-dir", str(tmp_path))
    assert result.code == 0, result.out
    assert result.data["stopped_reason"] == "max_seconds"
    sent = result.data["frames_sent"]
    assert 5 <= sent <= 21 and sent == len(recorded(ecu.requests, sent))  # at most 20 a second, and one at the start


def test_jsonl_streams_one_event_per_finding(ecu, virtual_channel, tmp_path):
    result = run_cli("fuzz", "guided", virtual_channel, "--id", "0x7E0", "--max-iterations", "10", *FAST,
                     "--findings-dir", str(tmp_path), "--jsonl")
    assert result.code == 0
    *events, envelope = [json.loads(line) for line in result.out.splitlines()]
    assert events and all(e["event_type"] == "fuzz_finding" for e in events)
    assert envelope["ok"] is True
    assert len(events) == len(list(next(tmp_path.iterdir()).glob("finding-*.json")))
    assert envelope["command"] == "fuzz guided" and envelope["data"]["findings_count"] == len(events)
    assert "events" not in envelope["data"]


def test_corpus_persists_findings_and_hosts_the_default_root(ecu, virtual_channel, tmp_path):
    corpus = tmp_path / "corpus"
    result = fuzz_cli(virtual_channel, "--max-iterations", "15", "--seed", "7", *FAST, "--corpus", str(corpus))
    assert result.code == 0, result.out
    assert Path(result.data["findings_dir"]).parent == corpus / "findings"
    entries = {p.read_bytes() for p in corpus.glob("*.bin")}
    found = {bytes.fromhex(e["payload"]["data"]) for e in result.data["events"]}
    assert entries == found - {fuzz.DEFAULT_SEED_DATA}   # the seed is not a finding of its own
    assert all(p.name == fuzz.corpus_entry_name(p.read_bytes()) for p in corpus.glob("*.bin"))


def test_default_findings_root_is_under_the_home_at_call_time(ecu, virtual_channel, monkeypatch, tmp_path):
    # TEST-TISO-07: no --findings-dir, no --corpus: the campaign lands under Path.home().
    result = fuzz_cli(virtual_channel, "--max-iterations", "3", *FAST)
    assert result.code == 0, result.out
    root = Path.home() / ".canarchy" / "findings"
    assert Path(result.data["findings_dir"]) == root / result.data["campaign_id"]
    assert (root / result.data["campaign_id"] / "campaign.json").is_file()
    other_home = tmp_path / "elsewhere"
    monkeypatch.setenv("HOME", str(other_home))
    assert fuzz.default_findings_root() == other_home / ".canarchy" / "findings"


# -- dry run -----------------------------------------------------------------------------

def test_dry_run_creates_nothing_and_sends_nothing(ecu, virtual_channel, tmp_path):
    findings, corpus = tmp_path / "findings", tmp_path / "corpus"
    result = fuzz_cli(virtual_channel, "--dry-run", "--seed", "1", "--max-iterations", "50",
                      "--findings-dir", str(findings), "--corpus", str(corpus))
    assert result.code == 0, result.out
    data = result.data
    assert data["mode"] == "dry_run" and data["planned_iterations"] == 50
    assert data["planned_payloads"][0] == "022701" and len(data["planned_payloads"]) == fuzz.PLAN_PREVIEW
    assert ecu.requests == []
    assert not findings.exists() and not corpus.exists()
    assert not (Path.home() / ".canarchy").exists()


def test_dry_run_needs_no_channel_and_no_transport(monkeypatch):
    def no_transport(*args, **kwargs):
        raise AssertionError("a dry run built a transport")

    monkeypatch.setattr("canarchy.transport.build_backend", no_transport)
    first = fuzz_cli(None, "--dry-run", "--seed", "9")
    second = fuzz_cli(None, "--dry-run", "--seed", "9")
    assert first.code == 0 and first.data["interface"] is None
    assert first.data["planned_payloads"] == second.data["planned_payloads"]
    assert not (Path.home() / ".canarchy").exists()


# -- safety and errors -------------------------------------------------------------------

def test_findings_root_is_a_file_stops_before_sending(ecu, virtual_channel, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    result = fuzz_cli(virtual_channel, "--max-iterations", "20", *FAST, "--findings-dir", str(blocker))
    assert result.code == 2
    assert result.error_codes == ["FUZZ_GUIDED_PERSISTENCE_FAILED"]
    assert "after 0 frame(s) sent" in result.envelope["errors"][0]["message"]
    assert ecu.requests == []


def test_unusable_corpus_dir_stops_before_sending_and_leaves_no_campaign(ecu, virtual_channel, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.write_text("a file, not a directory")
    findings = tmp_path / "findings"
    result = fuzz_cli(virtual_channel, *FAST, "--corpus", str(corpus), "--findings-dir", str(findings))
    assert result.code == 2 and result.error_codes == ["FUZZ_GUIDED_PERSISTENCE_FAILED"]
    assert ecu.requests == []
    assert list(findings.iterdir()) == []


def test_storage_failure_mid_campaign_stops_transmission(ecu, virtual_channel, tmp_path, monkeypatch):
    real_write = fuzz.write_json_atomic
    calls = []

    def failing_write(path, document):
        calls.append(path.name)
        if path.name.startswith("finding-"):
            raise OSError(28, "No space left on device")
        real_write(path, document)

    monkeypatch.setattr(fuzz, "write_json_atomic", failing_write)
    result = fuzz_cli(virtual_channel, "--max-iterations", "20", *FAST, "--findings-dir", str(tmp_path))
    assert result.code == 2
    assert result.error_codes == ["FUZZ_GUIDED_PERSISTENCE_FAILED"]
    sent = int(re.search(r"after (\d+) frame\(s\) sent", result.envelope["errors"][0]["message"]).group(1))
    assert sent == 1 == len(ecu.requests)   # the first reply is a finding; nothing was sent after it failed
    campaign_dir = next(tmp_path.iterdir())
    assert campaign_files(campaign_dir) == ["campaign.json"]   # no half-written finding, no temp file


def test_active_ack_required(ecu, virtual_channel, tmp_path, monkeypatch):
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "1")
    result = fuzz_cli(virtual_channel, *FAST, "--findings-dir", str(tmp_path / "f"))
    assert result.code == 1
    assert result.error_codes == ["ACTIVE_ACK_REQUIRED"]
    assert ecu.requests == [] and not (tmp_path / "f").exists()


def test_ack_active_runs_with_noninteractive_ack(ecu, virtual_channel, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CANARCHY_REQUIRE_ACTIVE_ACK", "1")
    monkeypatch.setenv("CANARCHY_MCP_NONINTERACTIVE_ACK", "1")
    result = fuzz_cli(virtual_channel, "--ack-active", "--max-iterations", "3", *FAST,
                      "--findings-dir", str(tmp_path))
    assert result.code == 0, result.out
    assert len(ecu.requests) == 3
    assert "ACTIVE TRANSMIT" in capsys.readouterr().err


def test_ack_active_declined_at_the_prompt(ecu, virtual_channel, tmp_path, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("no\n"))
    result = fuzz_cli(virtual_channel, "--ack-active", *FAST, "--findings-dir", str(tmp_path / "f"))
    assert result.code == 1 and result.error_codes == ["ACTIVE_CONFIRMATION_DECLINED"]
    assert ecu.requests == [] and not (tmp_path / "f").exists()


def test_no_channel_is_interface_required():
    result = fuzz_cli(None, *FAST)
    assert result.code == 1
    assert result.error_codes == ["INTERFACE_REQUIRED"]


@pytest.mark.parametrize("options, code", [
    (("--id", "0x7E0zz"), "INVALID_FRAME"),
    (("--id", "0x20000000"), "INVALID_FRAME"),
    (("--seed-data", "02270"), "INVALID_FRAME_DATA"),
    (("--seed-data", "zz"), "INVALID_FRAME_DATA"),
    (("--seed-data", ""), "INVALID_FRAME_DATA"),
    (("--seed-data", "001122334455667788"), "INVALID_FRAME_DATA"),
    (("--response-id", "0x7E0"), "INVALID_ARGUMENTS"),
    (("--rate", "0"), "INVALID_ARGUMENTS"),
    (("--max-iterations", "0"), "INVALID_ARGUMENTS"),
    (("--timeout", "1e300"), "INVALID_ARGUMENTS"),  # overflowed the clock: TRANSPORT_RECEIVE_FAILED, exit 2
    (("--timeout", "61"), "INVALID_ARGUMENTS"),  # a silent ID waited on for a minute a frame
    (("--slow-threshold", "1e9"), "INVALID_ARGUMENTS"),
])
def test_bad_arguments(options, code, tmp_path):
    result = run_cli("fuzz", "guided", "vcan0", "--id", "0x7E0", *options, "--dry-run", "--json")
    assert result.code == 1, result.out
    assert result.error_codes == [code]


def test_text_output_summarises_the_campaign(ecu, virtual_channel, tmp_path):
    result = run_cli("fuzz", "guided", virtual_channel, "--id", "0x7E0", "--max-iterations", "5", *FAST,
                     "--findings-dir", str(tmp_path))
    assert result.code == 0
    assert "5 iterations, 5 frames sent" in result.out and "positive:67" in result.out


# -- the engine --------------------------------------------------------------------------

@pytest.mark.parametrize("data, marker", [
    ("037f2735aaaaaaaa", "nrc:27:35"),
    ("06670111223344aa", "positive:67"),
    ("101462f190544d42", "positive:62"),    # first frame: the SID follows the 2-byte PCI
    ("300000aaaaaaaaaa", "isotp:fc:30"),
    ("2154aaaaaaaaaaaa", "isotp:cf"),
    ("0900000000000000", "isotp:invalid"),
    ("", "isotp:invalid"),
    ("0110", "other:10"),
])
def test_reply_markers(data, marker):
    assert fuzz_inputs.reply_marker(bytes.fromhex(data)) == marker


def test_markers_for_silence_and_slow_replies():
    reply = CanFrame(0x7E8, bytes.fromhex("027e00"))
    assert fuzz_inputs.markers_for([], None, 0.05) == ["silence"]
    assert fuzz_inputs.markers_for([reply], 0.2, 0.05) == ["positive:7E", "timing:slow"]
    assert fuzz_inputs.markers_for([reply], 0.01, 0.05) == ["positive:7E"]


def test_slow_reply_is_a_timing_marker(virtual_channel, tmp_path):
    # The default profile answers ClearDiagnosticInformation after 0.08 s (> P2server 0.05 s). The first
    # exchange on the bus is not judged for timing; the second (the same request, padded) is.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "padded.bin").write_bytes(bytes.fromhex("0414ffffffaaaaaa"))
    with SimulatedEcu(channel=virtual_channel):
        result = fuzz_cli(virtual_channel, "--seed-data", "0414ffffff", "--max-iterations", "2", "--rate", "10000",
                          "--timeout", "2", "--corpus", str(corpus), "--findings-dir", str(tmp_path / "f"))
    assert result.data["markers"] == ["positive:54", "timing:slow"]
    first, second = (e["payload"] for e in result.data["events"])
    assert (first["iteration"], first["markers"], first["timing_judged"]) == (0, ["positive:54"], False)
    assert first["latency_s"] > 0.05                   # it was slow; it is not judged
    assert (second["iteration"], second["new_classes"], second["timing_judged"]) == (1, ["sid:14 timing:slow"], True)


def test_opening_the_bus_is_not_counted_as_latency(virtual_channel, tmp_path, monkeypatch):
    """A bus that takes 0.6 s to open (a slow driver) does not make any reply look slow. The thresholds leave a
    loaded machine's replies room: slow means over 0.5 s here, and a counted opening would be over 0.6 s."""
    open_slowly(monkeypatch, 0.6)
    with SimulatedEcu(channel=virtual_channel):
        result = fuzz_cli(virtual_channel, "--max-iterations", "4", "--rate", "10000", "--timeout", "1.0",
                          "--slow-threshold", "0.5", "--seed", "1", "--findings-dir", str(tmp_path))
    assert result.code == 0, result.out
    assert "timing:slow" not in result.data["markers"]
    latencies = [e["payload"]["latency_s"] for e in result.data["events"] if e["payload"].get("latency_s") is not None]
    assert latencies and all(latency < 0.5 for latency in latencies), latencies


def test_max_seconds_count_from_the_open_bus(ecu, virtual_channel, tmp_path, monkeypatch):
    """A bus slower to open than --max-seconds: the deadline passed while it opened, and the campaign ended
    without a request sent."""
    open_slowly(monkeypatch, 0.6)
    result = fuzz_cli(virtual_channel, "--max-seconds", "0.4", "--max-iterations", "3", "--rate", "10000",
                      "--timeout", "2", "--findings-dir", str(tmp_path))
    assert result.code == 0, result.out
    assert result.data["frames_sent"] >= 1


def test_random_sids_answered_0x11_are_one_finding(ecu, virtual_channel, tmp_path):
    """serviceNotSupported for one random SID is news; for the next ones it is not (same shape, same class)."""
    result = fuzz_cli(virtual_channel, "--max-iterations", "300", "--seed", "4", "--rate", "10000",
                      "--timeout", "0.02", "--findings-dir", str(tmp_path))
    assert result.code == 0, result.out
    data = result.data
    unsupported = [sid for sid, classes in data["other_sids"].items() if classes == ["nrc:11"]]
    assert len(unsupported) >= 3                        # several random SIDs were refused with 0x11 ...
    findings = [e["payload"] for e in data["events"] if e["event_type"] == "fuzz_finding"]
    with_0x11 = [f for f in findings if "sid:* nrc:11" in f["new_classes"]]
    assert len(with_0x11) == 1                          # ... and that made one finding
    per_sid_markers = {m for m in data["markers"] if m.startswith("nrc:") and m.endswith(":11")}
    assert len(per_sid_markers) >= 3                    # the markers still name each SID
    assert data["findings_count"] == len(findings) <= len(data["classes"]) < 40


def test_first_finding_is_streamed_before_later_iterations(ecu, virtual_channel, tmp_path):
    """A 300-iteration campaign: the iteration-0 finding is on the stream before iteration 100's progress,
    and before the ECU received its third request (event order and what crossed the bus, no wall time)."""
    import io

    from canarchy.cli import main

    class Recording(io.StringIO):
        def __init__(self):
            super().__init__()
            self.requests_when_written = []

        def write(self, text):
            self.requests_when_written.append(len(ecu.requests))
            return super().write(text)

    out = Recording()
    code = main(["fuzz", "guided", virtual_channel, "--id", "0x7E0", "--max-iterations", "300", "--seed", "2",
                 "--rate", "10000", "--timeout", "0.02", "--findings-dir", str(tmp_path), "--jsonl"], stdout=out)
    assert code == 0, out.getvalue()[-2000:]
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    kinds = [line.get("event_type") for line in lines]
    progress = [i for i, kind in enumerate(kinds) if kind == "fuzz_progress"]
    assert [lines[i]["payload"]["iterations"] for i in progress] == [100, 200, 300]
    assert kinds[0] == "fuzz_finding" and lines[0]["payload"]["iteration"] == 0
    assert progress[0] > 0                               # the first finding precedes iteration 100's event
    assert out.requests_when_written[0] <= 2             # written while the campaign had barely begun
    first = lines[0]["payload"]
    assert "timing:slow" not in first["markers"] and first["timing_judged"] is False
    assert lines[-1]["command"] == "fuzz guided" and lines[-1]["data"]["iterations"] == 300
    # every finding appears before the progress event of a later hundred
    for index, line in enumerate(lines[:-1]):
        if line["event_type"] == "fuzz_finding":
            later = [i for i in progress if lines[i]["payload"]["iterations"] > line["payload"]["iteration"] + 1]
            assert not later or index < later[0]


def test_response_pending_waits_for_the_settled_answer(virtual_channel, tmp_path):
    with SimulatedEcu(channel=virtual_channel):
        result = fuzz_cli(virtual_channel, "--seed-data", "021101", "--max-iterations", "1",
                          "--rate", "100", "--timeout", "0.1", "--findings-dir", str(tmp_path))
    assert result.data["markers"] == ["nrc:11:78", "positive:51"]


@pytest.mark.parametrize("request_id, extended, response_id", [
    (0x7E0, False, 0x7E8),
    (0x18DA10F1, True, 0x18DAF110),
])
def test_default_response_id(request_id, extended, response_id):
    assert fuzz.default_response_id(request_id, extended) == response_id


def test_mutations_keep_the_single_frame_consistent():
    generator = fuzz_inputs.InputGenerator([bytes.fromhex("022701")], rng_seed=0)
    payloads = [generator.next()[0] for _ in range(300)]
    assert all(1 <= len(p) <= 8 for p in payloads)
    consistent = [p for p in payloads if p[0] >> 4 == 0 and p[0] & 0x0F == len(p) - 1]
    assert len(consistent) > 0.75 * len(payloads)   # raw (PCI-breaking) mutations are the exception
    assert sum(1 for p in consistent if p[1] != 0x27) < 0.25 * len(consistent)   # the SID mostly stays


def test_atomic_write_replaces_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "campaign.json"
    fuzz.write_json_atomic(target, {"b": 1, "a": 2})
    fuzz.write_json_atomic(target, {"c": 3})
    assert json.loads(target.read_text()) == {"c": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["campaign.json"]


def test_fuzz_progress_line_on_a_terminal(ecu, virtual_channel, tmp_path, monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr("canarchy.progress.DEFAULT_INTERVAL", 0.0)
    result = fuzz_cli(virtual_channel, "--max-iterations", "5", *FAST, "--findings-dir", str(tmp_path))
    assert result.code == 0, result.out
    lines = [part for part in terminal.getvalue().split("\r\x1b[K") if part.startswith("fuzz guided")]
    assert [int(re.fullmatch(r"fuzz guided \S+ 7E0: (\d)/5 iterations, [\d.]+/s, \d+ findings", line).group(1))
            for line in lines] == [1, 2, 3, 4, 5]  # one redraw per iteration at interval 0
    assert terminal.getvalue().endswith("\r\x1b[K")  # erased at the end
