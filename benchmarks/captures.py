"""Reading, printing and decoding a large candump log: speed and memory of every output form.

Two logs of ``frames`` frames (default 1,000,000) are generated in a
temporary directory from the real captures in ``fixtures/captures``:

- ``mixed.log``: the three captures (J1939 truck, Nissan Leaf UDS, Skoda OBD-II)
  one after the other, over and over; for parsing;
- ``j1939.log``: the J1939 truck capture over and over; for decoding against
  ``css_j1939_demo.dbc`` (EEC1, CCVS1), where about a third of the frames decode.

Lines keep their channel, ID and data; timestamps are rewritten so that they
keep each capture's gaps between frames and never go backwards.

Each measurement is a fresh process (``python -m benchmarks.captures worker
KIND LOG [DBC]``) that prints one JSON line: frames, decoded frames, seconds
and CPU seconds of the loop (imports and the DBC load are outside it), and its
resident set (KiB) before the loop and its peak during the loop (``VmHWM``,
reset before the loop where Linux allows). A reader that streams has the same
peak for a 45 MB file as before reading it.

Kinds:

``canarchy-read``
    ``canarchy.capture_file.open_capture(LOG)``, iterated.
``python-can-read``
    ``can.io.CanutilsLogReader(LOG)``, iterated.
``canarchy-decode``
    the ``decode`` command in process: ``canarchy.cli.main(["decode", "--file",
    LOG, "--dbc", DBC, "--summary", "--json"])`` (reader, J1939 PGN matching,
    cantools decoding, per-signal summaries).
``cantools-decode``
    python-can's reader and plain cantools: ``db.get_message_by_frame_id(id)``
    then ``message.decode(data)``, the database loaded with
    ``frame_id_mask=0x03FFFF00`` (priority and source address ignored, the
    usual way to match J1939 IDs in cantools; ``db.decode_message`` does not
    apply the mask). No summaries, nothing kept.
``capture-jsonl``, ``capture-json``, ``capture-text``
    the ``capture --file LOG`` command in process, every frame printed in that
    form to the null device (``mixed.log``).
``decode-jsonl``, ``decode-json``, ``decode-text``
    the ``decode --file LOG --dbc DBC`` command in process, every decoded
    message printed in that form to the null device (``j1939.log``).

Targets (:data:`TARGETS`, judged by ``benchmarks.report``): the candump parser
at most half of python-can's reader time; ``capture --jsonl`` no slower than
python-can's reader; every output form of ``capture --file`` and ``decode``
under 64 MiB peak resident set (stated for a 10,000,000-frame log:
``--frames 10000000``; a form that streams has the same peak at any size).
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence

#: The kinds that print through the CLI: kind -> (command, output flag).
CLI_KINDS = {
    "capture-jsonl": ("capture", "--jsonl"), "capture-json": ("capture", "--json"),
    "capture-text": ("capture", "--text"),
    "decode-jsonl": ("decode", "--jsonl"), "decode-json": ("decode", "--json"), "decode-text": ("decode", "--text"),
}
KINDS = ("canarchy-read", "python-can-read", "capture-jsonl", "capture-json", "capture-text",
         "canarchy-decode", "decode-jsonl", "decode-json", "decode-text", "cantools-decode")
READ_KINDS = ("canarchy-read", "python-can-read", "capture-jsonl", "capture-json", "capture-text")
DECODE_KINDS = ("canarchy-decode", "decode-jsonl", "decode-json", "decode-text", "cantools-decode")
#: The targets: time ratios to python-can's reader (lower is faster) and the memory ceiling.
TARGETS = {"parse_time_ratio": 0.5, "capture_jsonl_time_ratio": 1.0, "peak_mib": 64.0}
#: The kinds the memory ceiling applies to.
MEMORY_KINDS = tuple(CLI_KINDS) + ("canarchy-decode",)
J1939_ID_MASK = 0x03FFFF00  # SAE J1939-21: data page + PDU format + PDU specific
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
MIXED_SOURCES = ("j1939_truck_idle.log", "nissan_leaf_uds_79b_7bb.log", "obd2_skoda_7e0_7e8.log")
J1939_SOURCES = ("j1939_truck_idle.log",)
J1939_DBC = "css_j1939_demo.dbc"


def _capture_lines(path: Path) -> list[tuple[float, str]]:
    """``(timestamp, rest of the line)`` for each frame line of a candump ``-l`` log."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        stamp, _, rest = line.strip().partition(" ")
        if not rest or not (stamp.startswith("(") and stamp.endswith(")")):
            continue
        out.append((float(stamp[1:-1]), rest))
    return out


def generate_log(dest: Path, sources: Sequence[Path], frames: int, *, start: float = 1_700_000_000.0,
                 gap: float = 0.001) -> int:
    """Write a candump ``-l`` log of exactly ``frames`` frames to ``dest``, cycling
    through ``sources``; return the number of frames written.

    Each source keeps its own gaps between frames (a negative gap becomes 0);
    ``gap`` seconds separate one copy of a source from the next. Raises
    ``ValueError`` when the sources hold no frame or ``frames`` < 1.
    """
    if frames < 1:
        raise ValueError("frames must be at least 1")
    parsed = [_capture_lines(Path(p)) for p in sources]
    if not any(parsed):
        raise ValueError("the sources hold no candump frame")
    clock = start
    written = 0
    with open(dest, "w", encoding="utf-8", newline="\n") as out:
        while written < frames:
            for lines in parsed:
                previous = None
                chunk = []
                for stamp, rest in lines:
                    if written + len(chunk) >= frames:
                        break
                    if previous is not None:
                        clock += max(0.0, stamp - previous)
                    previous = stamp
                    chunk.append(f"({clock:.6f}) {rest}\n")
                out.writelines(chunk)
                written += len(chunk)
                clock += gap
                if written >= frames:
                    break
    return written


# --------------------------------------------------------------------------- worker (child process)


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _rss_kib() -> int:
    current = _status_kib("VmRSS")
    return current if current is not None else int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _peak_kib() -> int:
    peak = _status_kib("VmHWM")
    return peak if peak is not None else int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _loop(kind: str, log: str, dbc: str | None) -> Callable[[], tuple[int, int]]:
    """Import and prepare what ``kind`` needs; return the loop to time: () -> (frames, decoded)."""
    if kind == "canarchy-read":
        from canarchy.capture_file import open_capture

        def loop() -> tuple[int, int]:
            count = 0
            for _frame in open_capture(log):
                count += 1
            return count, 0
        return loop
    if kind == "python-can-read":
        from can.io import CanutilsLogReader

        def loop() -> tuple[int, int]:
            count = 0
            for _message in CanutilsLogReader(log):
                count += 1
            return count, 0
        return loop
    if kind == "canarchy-decode":
        import io

        from canarchy import cli
        from canarchy.decode.dbc import load_dbc

        load_dbc(dbc)  # import cantools before the clock starts, as for the cantools loop

        def loop() -> tuple[int, int]:
            out = io.StringIO()
            code = cli.main(["decode", "--file", log, "--dbc", dbc, "--summary", "--json"], stdout=out)
            if code != 0:
                raise SystemExit(f"canarchy decode exited {code}: {out.getvalue()[-500:]}")
            data = json.loads(out.getvalue())["data"]
            return data["frame_count"], data["decoded_count"]
        return loop
    if kind in CLI_KINDS:
        import os

        from canarchy import cli

        command, flag = CLI_KINDS[kind]
        argv = (["capture", "--file", log, flag] if command == "capture"
                else ["decode", "--file", log, "--dbc", dbc, flag])
        if command == "decode":
            from canarchy.decode.dbc import load_dbc

            load_dbc(dbc)  # import cantools before the clock starts

        with open(log, encoding="utf-8") as lines:
            frames = sum(1 for _ in lines)  # before the clock: every line of a generated log is a frame

        def loop() -> tuple[int, int]:
            with open(os.devnull, "w", encoding="utf-8") as sink:
                code = cli.main(argv, stdout=sink)
            if code != 0:
                raise SystemExit(f"canarchy {command} {flag} exited {code}")
            return frames, 0
        return loop
    if kind == "cantools-decode":
        import cantools
        from can.io import CanutilsLogReader

        database = cantools.database.load_file(dbc, frame_id_mask=J1939_ID_MASK)

        def loop() -> tuple[int, int]:
            count = decoded = 0
            lookup = database.get_message_by_frame_id  # masks the ID (decode_message does not)
            for message in CanutilsLogReader(log):
                count += 1
                try:
                    found = lookup(message.arbitration_id, message.is_extended_id)
                except KeyError:  # not in the database
                    continue
                found.decode(message.data, allow_truncated=True)
                decoded += 1
            return count, decoded
        return loop
    raise SystemExit(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")


def _reset_peak() -> bool:
    """Restart the high-water mark (Linux >= 4.0: ``5`` to ``/proc/self/clear_refs``), so
    that the peak is the loop's, not that of imports or compiling byte code."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def worker(kind: str, log: str, dbc: str | None = None) -> dict[str, float | int | str]:
    """Run one measurement in this process; return its figures (see the module docstring)."""
    loop = _loop(kind, log, dbc)
    _reset_peak()
    before = _rss_kib()
    wall, cpu = time.perf_counter(), time.process_time()
    frames, decoded = loop()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"kind": kind, "frames": frames, "decoded": decoded, "seconds": wall, "cpu_seconds": cpu,
            "rss_before_kib": before, "peak_kib": _peak_kib()}


# --------------------------------------------------------------------------- parent


@dataclass
class KindRuns:
    """The runs of one kind: each worker's JSON result, and failures."""

    kind: str
    log: str
    results: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def rates(self) -> list[float]:
        """Frames per second of each run (loop wall time)."""
        return [r["frames"] / r["seconds"] for r in self.results if r["seconds"] > 0]

    def cpu_rates(self) -> list[float]:
        """Frames per CPU second of each run."""
        return [r["frames"] / r["cpu_seconds"] for r in self.results if r["cpu_seconds"] > 0]


@dataclass
class CaptureResult:
    """Sizes of the generated logs (bytes, frames) and the runs of each kind."""

    logs: dict[str, dict[str, int]]
    kinds: dict[str, KindRuns]


def run_captures(*, frames: int = 1_000_000, runs: int = 3, kinds: Iterable[str] = KINDS, timeout: float = 900.0,
                 log: Callable[[str], None] = print) -> CaptureResult:
    """Generate the logs in a temporary directory and run each kind ``runs`` times, interleaved."""
    from benchmarks import measure

    kinds = list(kinds)
    with tempfile.TemporaryDirectory(prefix="canarchy-bench-captures-") as tmp:
        root = Path(tmp)
        paths = {"mixed": root / "mixed.log", "j1939": root / "j1939.log"}
        logs = {}
        for name, sources in (("mixed", MIXED_SOURCES), ("j1939", J1939_SOURCES)):
            written = generate_log(paths[name], [FIXTURES / s for s in sources], frames)
            logs[name] = {"frames": written, "bytes": paths[name].stat().st_size}
        log(f"captures: generated {logs['mixed']['frames']:,} frames "
            f"({logs['mixed']['bytes'] / 2**20:.0f} MiB) per log")
        home = root / "home"
        home.mkdir()
        env = measure.child_env(home, bytecode_prefix=root / "pycache")
        dbc = str(FIXTURES / J1939_DBC)
        result = CaptureResult(logs=logs, kinds={
            k: KindRuns(k, "mixed" if k in READ_KINDS else "j1939") for k in kinds})
        for round_no in range(runs):
            for kind in kinds:
                runs_of = result.kinds[kind]
                argv = [measure.python(), "-m", "benchmarks.captures", "worker", kind, str(paths[runs_of.log])]
                if kind in DECODE_KINDS:
                    argv.append(dbc)
                proc = measure.run(argv, env=env, cwd=Path(__file__).resolve().parents[1], timeout=timeout)
                line = proc.output.strip().splitlines()[-1] if proc.output.strip() else ""
                try:
                    runs_of.results.append(json.loads(line) if proc.ok else None)
                except json.JSONDecodeError:
                    runs_of.results.append(None)
                if runs_of.results[-1] is None:
                    runs_of.results.pop()
                    runs_of.failures.append(f"exit {proc.returncode}: {proc.output.strip()[-300:]}")
            log(f"captures round {round_no + 1}/{runs}: " + ", ".join(
                f"{k} {measure.median(result.kinds[k].rates()[-1:]) / 1000:.0f}k frames/s"
                for k in kinds if result.kinds[k].results))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``worker KIND LOG [DBC]``: print one JSON line of figures."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (3, 4) or args[0] != "worker":
        print("usage: python -m benchmarks.captures worker KIND LOG [DBC]", file=sys.stderr)
        return 2
    print(json.dumps(worker(args[1], args[2], args[3] if len(args) == 4 else None), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
