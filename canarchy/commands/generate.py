"""``generate [CHANNEL]``: send generated frames, in the manner of can-utils' ``cangen`` (active).

ID, DLC (the ISO 11898-1 DLC code) and data are each fixed, random (``r``) or incrementing (``i``);
``--count`` frames ``--gap`` milliseconds apart, or ``--forever``. Every random choice comes from one
``random.Random(--seed)``, so ``--dry-run`` (no channel needed) lists exactly the frames a run with the same
seed sends. The active-transmit gate (:mod:`canarchy.active`) runs before the run's one bus is opened.
Options, defaults and output: ``docs/generate-and-simulate.md``.
"""

from __future__ import annotations

import argparse
import random
import secrets
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterator

from canarchy.active import active_gate, add_active_arguments
from canarchy.commands._common import parse_hex_data, parse_int
from canarchy.errors import UserInputError
from canarchy.frame_syntax import parse_arbitration_id
from canarchy.output import CommandResult, open_stream

DEFAULT_COUNT = 10
DEFAULT_GAP_MS = 200.0
#: Frames shown by a dry run of ``--forever``.
PREVIEW_FRAMES = 10
RANDOM, INCREMENT, FIXED = "random", "increment", "fixed"
_MODE_WORDS = {"r": RANDOM, "i": INCREMENT}
# ISO 11898-1: CAN FD data length per DLC code 0..15 (0..8 are the same as classic CAN).
FD_LENGTHS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 48, 64)


def add_parser(subparsers, parent: argparse.ArgumentParser) -> None:
    """Register ``generate``."""
    p = subparsers.add_parser("generate", parents=[parent],
                              help="send generated frames (cangen-style: fixed, random or incrementing; active)")
    p.add_argument("channel", nargs="?", help="CAN channel (default: [transport].default_interface)")
    p.add_argument("--id", default="r", metavar="ID|r|i",
                   help="arbitration ID: hex (0x optional; 3 digits 11-bit, 8 digits 29-bit, as send), "
                        "r random, i incrementing (default r)")
    p.add_argument("--dlc", default=None, metavar="DLC|r|i",
                   help="DLC code: 0-8 (0-15 with --fd), r random, i incrementing "
                        "(default: the length of fixed --data, else r)")
    p.add_argument("--data", default="r", metavar="HEX|r|i",
                   help="payload: hex, r random, i incrementing counter (default r)")
    p.add_argument("--extended", action="store_true", help="29-bit arbitration IDs")
    p.add_argument("--fd", action="store_true", help="CAN FD frames (DLC codes up to 15 = 64 bytes)")
    p.add_argument("--count", default=None, help=f"frames to send (default {DEFAULT_COUNT})")
    p.add_argument("--forever", action="store_true", help="send until Ctrl+C instead of --count frames")
    p.add_argument("--gap", default=None, metavar="MS",
                   help=f"milliseconds between frames (default {DEFAULT_GAP_MS:g}, like cangen)")
    p.add_argument("--seed", default=None, help="seed of the random choices (default: random, reported)")
    add_active_arguments(p)
    p.set_defaults(command="generate", handler=_generate, takes_channel=True,
                   no_interface_ok=lambda a: a.dry_run, render_text=_render_text, render_event=_render_frame)


@dataclass(frozen=True)
class GeneratorSpec:
    """What to generate: a mode and a fixed value for each of ID, DLC and data.

    ``id_mode``/``dlc_mode``/``data_mode``: ``"fixed"``, ``"random"`` or
    ``"increment"``; ``dlc_mode`` may also be ``"data"`` (the length of the
    fixed data). ``fixed_id`` (int), ``fixed_dlc`` (DLC code), ``fixed_data``
    (bytes) hold the fixed values. ``extended``: 29-bit IDs; ``fd``: CAN FD.
    """

    id_mode: str
    fixed_id: int
    dlc_mode: str
    fixed_dlc: int
    data_mode: str
    fixed_data: bytes
    extended: bool
    fd: bool

    def frames(self, seed: int) -> Iterator[tuple[int, bytes]]:
        """Yield ``(arbitration_id, data)`` forever, deterministically for ``seed``.

        Per frame the random draws are made in the order ID, DLC, data.
        """
        rng = random.Random(seed)
        id_space = 0x20000000 if self.extended else 0x800
        dlc_space = 16 if self.fd else 9
        index = 0
        while True:
            if self.id_mode == RANDOM:
                can_id = rng.randrange(id_space)
            elif self.id_mode == INCREMENT:
                can_id = index % id_space
            else:
                can_id = self.fixed_id
            if self.dlc_mode == RANDOM:
                dlc = rng.randrange(dlc_space)
            elif self.dlc_mode == INCREMENT:
                dlc = index % dlc_space
            else:
                dlc = self.fixed_dlc
            length = FD_LENGTHS[dlc]
            if self.data_mode == RANDOM:
                data = rng.randbytes(length)
            elif self.data_mode == INCREMENT:
                data = (index % (1 << (8 * length))).to_bytes(length, "little") if length else b""
            else:
                data = self.fixed_data[:length].ljust(length, b"\x00")
            yield can_id, data
            index += 1


def _mode(text: str) -> str | None:
    return _MODE_WORDS.get(text.strip().lower())


def parse_spec(id_text: str, dlc_text: str | None, data_text: str, extended: bool, fd: bool) -> GeneratorSpec:
    """Build a :class:`GeneratorSpec` from the option strings.

    Raises ``UserInputError``: ``INVALID_FRAME`` (an ID that is not hex or does
    not fit), ``INVALID_DLC`` (a DLC code out of range), ``INVALID_FRAME_DATA``
    (data that is not hex, too long, or not a CAN FD length).
    """
    id_mode = _mode(id_text) or FIXED
    fixed_id = 0
    if id_mode == FIXED:  # read as send reads an ID: 3 hex digits an 11-bit ID, 8 digits a 29-bit one
        fixed_id, wide = parse_arbitration_id(id_text.strip())
        extended = extended or wide
    max_dlc = 15 if fd else 8
    data_mode = _mode(data_text) or FIXED
    fixed_data = b""
    if data_mode == FIXED:
        fixed_data = parse_hex_data(data_text, max_bytes=64 if fd else 8)
    fixed_dlc = 0
    if dlc_text is None:
        dlc_mode = "data" if data_mode == FIXED else RANDOM
        if data_mode == FIXED:
            if len(fixed_data) not in FD_LENGTHS[:max_dlc + 1]:
                raise UserInputError("INVALID_FRAME_DATA",
                                     f"--data has {len(fixed_data)} bytes, not a CAN FD length {FD_LENGTHS}.",
                                     "Pad the data to a CAN FD length, or give --dlc.")
            fixed_dlc = FD_LENGTHS.index(len(fixed_data))
    else:
        dlc_mode = _mode(dlc_text) or FIXED
        if dlc_mode == FIXED:
            fixed_dlc = parse_int(dlc_text, "INVALID_DLC", "--dlc", 0, max_dlc,
                                  f"Give the DLC code 0-{max_dlc}" + (" (15 = 64 bytes)" if fd else "")
                                  + ", or r, i.")
    return GeneratorSpec(id_mode, fixed_id, dlc_mode, fixed_dlc, data_mode, fixed_data, extended, fd)


@dataclass(frozen=True)
class _Run:
    spec: GeneratorSpec
    count: int | None  # None: --forever
    gap_ms: float
    seed: int


def _parse_run(args: argparse.Namespace) -> _Run:
    spec = parse_spec(args.id, args.dlc, args.data, args.extended, args.fd)
    if args.forever and args.count is not None:
        raise UserInputError("INVALID_ARGUMENTS", "--count and --forever exclude each other.",
                             "Give --count N for N frames, or --forever to send until Ctrl+C.")
    count = None
    if not args.forever:
        count = DEFAULT_COUNT if args.count is None else parse_int(
            args.count, "INVALID_COUNT", "--count", 1, 10**9, "Give --count as a whole number >= 1 (or --forever).")
    gap_ms = DEFAULT_GAP_MS
    if args.gap is not None:
        try:
            gap_ms = float(args.gap)
        except ValueError:
            gap_ms = -1.0
        if not 0 <= gap_ms <= 3_600_000:
            raise UserInputError("INVALID_GAP", f"--gap {args.gap!r} is not a number of milliseconds 0..3600000.",
                                 "Give the gap between frames in milliseconds, e.g. --gap 10 (0: back to back).")
    seed = secrets.randbits(32) if args.seed is None else parse_int(
        args.seed, "INVALID_ARGUMENTS", "--seed", 0, 2**64 - 1, "Give --seed as a whole number >= 0.")
    return _Run(spec, count, gap_ms, seed)


def _frame_payload(can_id: int, data: bytes, spec: GeneratorSpec, index: int) -> dict[str, Any]:
    return {"index": index, "arbitration_id": can_id, "data": data.hex(), "dlc": len(data),
            "is_extended_id": spec.extended, "is_fd": spec.fd}


def _common(args: argparse.Namespace, run: _Run) -> dict[str, Any]:
    spec = run.spec
    return {
        "interface": args.interface,
        "count": run.count,
        "forever": run.count is None,
        "gap_ms": run.gap_ms,
        "seed": run.seed,
        "id_mode": spec.id_mode,
        "dlc_mode": spec.dlc_mode,
        "data_mode": spec.data_mode,
        "extended": spec.extended,
        "fd": spec.fd,
    }


def _generate(args: argparse.Namespace) -> CommandResult:
    run = _parse_run(args)
    common = _common(args, run)
    if args.dry_run:
        shown = PREVIEW_FRAMES if run.count is None else run.count
        stream = open_stream(args, "generate:dry_run")
        with stream.stoppable():
            for index, (can_id, data) in zip(range(shown), run.spec.frames(run.seed), strict=False):
                stream.emit("frame_planned", _frame_payload(can_id, data, run.spec, index))
        return CommandResult(data=dict(common, mode="dry_run", planned_frames=run.count, frames_shown=stream.count,
                                       stopped_by=_stopped_by(stream, "count")))
    action = (f"send {run.count} generated frames" if run.count is not None
              else "send generated frames until Ctrl+C") + f" ({run.gap_ms:g} ms apart)"
    warning = active_gate("generate", args.interface, action, args.ack_active)
    return _transmit(args, run, common, warning)


def _transmit(args: argparse.Namespace, run: _Run, common: dict[str, Any], warning: str) -> CommandResult:
    from canarchy.frames import CanFrame
    from canarchy.transport import build_backend

    backend = build_backend()
    stream = open_stream(args, f"generate:{args.interface}", live=True)
    gap = run.gap_ms / 1000.0
    started = time.monotonic()
    with backend.sender(args.interface) as send, stream.stoppable():  # Ctrl+C ends the run; the frames sent stand
        for index, (can_id, data) in enumerate(run.spec.frames(run.seed)):
            if run.count is not None and index >= run.count:
                break
            if not index:  # the schedule starts with the first frame, once the bus is open (as cangen -g's gaps)
                started = time.monotonic()
            else:
                delay = started + index * gap - time.monotonic()  # a schedule, so gaps do not drift
                if delay > 0:
                    time.sleep(delay)
            frame = CanFrame(can_id, data, is_extended_id=run.spec.extended, is_fd=run.spec.fd,
                             timestamp=time.time(), channel=args.interface, is_rx=False)
            send(frame)
            stream.emit("frame_sent", dict(frame.to_payload(), index=index), frame.timestamp)
    data = dict(common, mode="active", interface_source=args.interface_source, frames_sent=stream.count,
                stopped_by=_stopped_by(stream, "count"), elapsed_s=round(time.monotonic() - started, 6))
    return CommandResult(data=data, warnings=[warning])


def _stopped_by(stream, otherwise: str) -> str:
    """The signal that stopped the run (``SIGINT``, ``SIGTERM``: as capture says), else ``otherwise``."""
    return stream.stopped_by or otherwise


def _render_frame(event: dict[str, Any]) -> str:
    f = event["payload"]
    width = 8 if f["is_extended_id"] else 3
    return f"  {f['arbitration_id']:0{width}X}  [{f['dlc']}]  {f['data'].upper()}".rstrip()


def _render_text(result: CommandResult) -> str:
    d = result.data
    stopped = f" (stopped by {d['stopped_by']})" if d["stopped_by"] in ("SIGINT", "SIGTERM") else ""
    if d["mode"] == "dry_run":
        planned = "frames" if d["forever"] else f"{d['planned_frames']} frames"
        until = " until Ctrl+C" if d["forever"] else ""
        return (f"dry run: would send {planned} {d['gap_ms']:g} ms apart{until} on {d['interface'] or '(no channel)'}, "
                f"seed {d['seed']}; nothing sent" + (f" ({d['frames_shown']} shown)" if d["forever"] else "") + stopped)
    return (f"generate on {d['interface']}: {d['frames_sent']} frames sent in {d['elapsed_s']:.3f} s, "
            f"seed {d['seed']}" + (stopped or " (done)"))
