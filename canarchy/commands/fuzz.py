"""``fuzz guided [CHANNEL] --id ID``: response-feedback fuzzing of one arbitration ID.

Active (the active-transmit gate runs first); ``--dry-run`` plans without a
channel, a transport or a file. The engine and storage live in
:mod:`canarchy.fuzz`; see ``docs/fuzz-guided.md``.
"""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path
from typing import Any

from canarchy import fuzz, fuzz_inputs, progress
from canarchy.output import CommandResult
from canarchy.progress import ActiveRun
from canarchy.commands._common import MAX_TIMEOUT_S, parse_arbitration_id, parse_hex_data
from canarchy.errors import UserInputError
from canarchy.frames import CanFrame, can_id_text


#: A ``fuzz_progress`` event every this many iterations.
PROGRESS_EVERY = 100


def _positive_int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _wait(text: str) -> float:
    """A reply wait in seconds: > 0 and at most :data:`~._common.MAX_TIMEOUT_S` (a longer one left a silent ID
    waited on for ever; ``1e300`` overflowed the clock)."""
    value = _positive_float(text)
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_TIMEOUT_S:g} seconds, got {text!r}")
    return value


def _rng_seed(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def add_parser(subparsers: Any, parent: argparse.ArgumentParser) -> None:
    """Register the ``fuzz`` group and its ``guided`` command."""
    from canarchy.active import add_active_arguments

    group = subparsers.add_parser("fuzz", parents=[parent], help="fuzzing campaigns (active)")
    group_sub = group.add_subparsers(dest="fuzz_command", metavar="COMMAND")
    group_sub.required = True
    p = group_sub.add_parser(
        "guided", parents=[parent],
        help="response-feedback fuzzing of one arbitration ID (active)",
        description="Mutate a seed payload, send it, keep inputs whose replies (NRCs, silence, timing) are new.",
    )
    p.add_argument("channel", nargs="?", default=None, help="CAN channel (default: [transport].default_interface)")
    p.add_argument("--id", required=True, help="request arbitration ID, e.g. 0x7E0 (> 0x7FF: 29-bit)")
    p.add_argument("--response-id", default=None,
                   help="arbitration ID replies arrive on (default: ID + 8 for 11-bit; 0x18DA swap for 29-bit)")
    p.add_argument("--seed-data", default=fuzz.DEFAULT_SEED_DATA.hex(),
                   help=f"seed payload as hex (default: {fuzz.DEFAULT_SEED_DATA.hex()}, SecurityAccess requestSeed)")
    p.add_argument("--max-iterations", type=_positive_int, default=fuzz.DEFAULT_MAX_ITERATIONS,
                   help=f"frames to send at most (default: {fuzz.DEFAULT_MAX_ITERATIONS})")
    p.add_argument("--max-seconds", type=_positive_float, default=None, help="wall-clock budget in seconds")
    p.add_argument("--rate", type=_positive_float, default=fuzz.DEFAULT_RATE,
                   help=f"frames per second at most (default: {fuzz.DEFAULT_RATE:g})")
    p.add_argument("--seed", type=_rng_seed, default=None,
                   help="random seed (same seed, same sequence; default: random, reported)")
    p.add_argument("--timeout", type=_wait, default=fuzz.DEFAULT_TIMEOUT,
                   help=f"seconds to wait for a reply (default: {fuzz.DEFAULT_TIMEOUT:g})")
    p.add_argument("--slow-threshold", type=_wait, default=fuzz.DEFAULT_SLOW_THRESHOLD,
                   help=f"first-reply latency in seconds that counts as timing:slow "
                        f"(default: {fuzz.DEFAULT_SLOW_THRESHOLD:g}, P2server_max)")
    p.add_argument("--corpus", default=None, help="corpus directory: *.bin entries loaded and new ones saved")
    p.add_argument("--findings-dir", default=None,
                   help="findings root (default: <corpus>/findings, else ~/.canarchy/findings)")
    add_active_arguments(p)
    p.set_defaults(command="fuzz guided", handler=_guided, takes_channel=True,
                   no_interface_ok=lambda a: a.dry_run, render_text=_render_text, render_event=_render_finding)


def _guided(args: argparse.Namespace) -> CommandResult:
    arbitration_id, is_extended_id = parse_arbitration_id(args.id)
    if args.response_id is None:
        response_id = fuzz.default_response_id(arbitration_id, is_extended_id)
    else:
        response_id, _ = parse_arbitration_id(args.response_id)
    if response_id == arbitration_id:
        raise UserInputError(
            "INVALID_ARGUMENTS",
            f"The response ID 0x{response_id:X} equals the request ID.",
            "Pass --response-id with the arbitration ID the target answers on (e.g. 0x7E8 for 0x7E0).",
        )
    seed_data = parse_hex_data(args.seed_data, max_bytes=fuzz_inputs.MAX_CLASSIC_DATA)
    if not seed_data:
        raise UserInputError("INVALID_FRAME_DATA", "The seed payload is empty.",
                             "Give 1 to 8 bytes as hex, e.g. --seed-data 022701.")
    CanFrame(arbitration_id, seed_data, is_extended_id)
    corpus_dir = None if args.corpus is None else Path(args.corpus).expanduser()
    corpus, warnings = fuzz.load_corpus(corpus_dir)
    rng_seed = secrets.randbits(32) if args.seed is None else args.seed
    findings_root = fuzz.resolve_findings_root(args.findings_dir, corpus_dir)
    common = {
        "arbitration_id": arbitration_id,
        "is_extended_id": is_extended_id,
        "response_id": response_id,
        "seed_data": seed_data.hex(),
        "seed": rng_seed,
        "interface": args.interface,
        "corpus_dir": None if corpus_dir is None else str(corpus_dir),
        "findings_root": str(findings_root),
    }
    if args.dry_run:
        planned = fuzz_inputs.plan_payloads(seed_data, corpus, rng_seed, min(args.max_iterations, fuzz.PLAN_PREVIEW))
        data = dict(common, mode="dry_run", planned_iterations=args.max_iterations, max_seconds=args.max_seconds,
                    rate=args.rate, corpus_size=len({seed_data, *corpus}),
                    planned_payloads=[payload.hex() for payload in planned])
        return CommandResult(data=data, warnings=warnings)

    from canarchy import transport
    from canarchy.active import active_gate

    channel = args.interface
    active_gate("fuzz guided", channel,
                f"send up to {args.max_iterations} fuzzed frames on arbitration ID {can_id_text(arbitration_id)}",
                args.ack_active)
    backend = transport.build_backend()
    settings = fuzz.CampaignSettings(
        channel=channel, arbitration_id=arbitration_id, is_extended_id=is_extended_id, response_id=response_id,
        seed_data=seed_data, rng_seed=rng_seed, findings_root=findings_root, max_iterations=args.max_iterations,
        max_seconds=args.max_seconds, rate=args.rate, timeout=args.timeout, slow_threshold=args.slow_threshold,
        corpus_dir=corpus_dir, corpus=corpus, backend_name=backend.name,
    )
    run = ActiveRun(args, f"fuzz:{channel}")

    def on_finding(finding: dict[str, Any]) -> None:
        run.emit("fuzz_finding", finding, finding["timestamp"])

    def on_iteration(status: dict[str, Any]) -> None:
        rate = progress.rate(status["iterations"], status["elapsed_s"])
        run.progress.update(f"fuzz guided {channel} {can_id_text(arbitration_id)}: {status['iterations']}/"
                            f"{args.max_iterations} iterations, {rate}, {status['findings']} findings")
        if status["iterations"] % PROGRESS_EVERY == 0:
            run.emit("fuzz_progress", dict(status, max_iterations=args.max_iterations,
                                           rate_hz=round(status["iterations"] / status["elapsed_s"], 3)
                                           if status["elapsed_s"] > 0 else None))

    outcome = fuzz.run_campaign(settings, backend, on_finding=on_finding, on_iteration=on_iteration)
    data = dict(common, mode="active", campaign_id=outcome.campaign_id, findings_dir=str(outcome.campaign_dir),
                iterations=outcome.iterations, frames_sent=outcome.frames_sent,
                findings_count=len(outcome.findings), markers=outcome.markers, classes=outcome.classes,
                other_sids=outcome.other_sids, late_replies=outcome.late_replies,
                stopped_reason=outcome.stopped_reason, corpus_size=outcome.corpus_size,
                elapsed_s=round(outcome.elapsed, 6), backend=backend.name)
    return run.result(data, warnings)


def _render_text(result: CommandResult) -> str:
    data = result.data
    if data.get("mode") == "dry_run":
        lines = [
            f"dry run: would send up to {data['planned_iterations']} fuzzed frames on "
            f"{can_id_text(data['arbitration_id'])} (replies on {can_id_text(data['response_id'])}), "
            f"seed {data['seed']}; nothing sent, nothing written",
            "first planned payloads:",
        ]
        lines += [f"  {payload}" for payload in data["planned_payloads"]]
        return "\n".join(lines)
    lines = [
        f"campaign {data['campaign_id']} on {data['interface']} ({can_id_text(data['arbitration_id'])} -> "
        f"{can_id_text(data['response_id'])}): {data['iterations']} iterations, "
        f"{data['frames_sent']} frames sent, {data['findings_count']} findings ({data['stopped_reason']})",
        f"findings: {data['findings_dir']}",
        f"markers: {', '.join(data['markers']) or '-'}",
    ]
    return "\n".join(lines)


def _render_finding(event: dict[str, Any]) -> str | None:
    if event["event_type"] != "fuzz_finding":
        return None  # fuzz_progress: the terminal's progress line shows it
    finding = event["payload"]
    return f"  #{finding['iteration']:>6} {finding['data']:<16} new: {', '.join(finding['new_classes'])}"
