"""Response-feedback fuzzing of one arbitration ID (``fuzz guided``).

Pick an input from the corpus, mutate it, send it, and turn the replies on the response ID into markers
(``nrc:27:35``, ``silence``, ``timing:slow`` ...); an input is a finding when a reply's response class
(:func:`~canarchy.fuzz_inputs.response_class`) is new for its request shape
(:func:`~canarchy.fuzz_inputs.request_shape`). Findings are written as they
happen and reported to ``on_finding``; one bus serves the whole campaign. Markers, shapes, timing, storage
and errors: ``docs/fuzz-guided.md``.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from canarchy.errors import TransportError, UserInputError
from canarchy.fileio import write_bytes_atomic, write_json_atomic
from canarchy.fuzz_inputs import (MAX_CLASSIC_DATA, SHAPE_OTHER_SID, InputGenerator, is_response_pending, marker_weight,
                                  markers_for, novelty_keys, request_shape, response_class, seeded_sids,
                                  split_single_frame)
from canarchy.frames import MAX_STANDARD_ID, CanFrame
from canarchy.transport import Backend

COMMAND = "fuzz guided"
DEFAULT_SEED_DATA = bytes.fromhex("022701")  # ISO-TP SF, SecurityAccess requestSeed level 1
DEFAULT_MAX_ITERATIONS = 200
DEFAULT_RATE = 10.0          # frames per second
DEFAULT_TIMEOUT = 0.2        # seconds to wait for a reply (after the last 0x78)
DEFAULT_SLOW_THRESHOLD = 0.05  # P2server_max default, ISO 14229-2
PLAN_PREVIEW = 10            # planned payloads a dry run shows


def default_findings_root() -> Path:
    """The default findings root, ``~/.canarchy/findings`` (``Path.home()`` read now, at call time)."""
    return Path.home() / ".canarchy" / "findings"


def resolve_findings_root(findings_dir: str | os.PathLike[str] | None,
                          corpus_dir: str | os.PathLike[str] | None) -> Path:
    """``findings_dir`` if given, else ``<corpus_dir>/findings``, else :func:`default_findings_root`."""
    if findings_dir:
        return Path(findings_dir).expanduser()
    if corpus_dir:
        return Path(corpus_dir).expanduser() / "findings"
    return default_findings_root()


# -- addressing --

def default_response_id(arbitration_id: int, is_extended_id: bool) -> int:
    """The usual response ID for a request ID (:func:`canarchy.isotp.default_response_id`).

    Raises ``UserInputError`` ``INVALID_ARGUMENTS`` when there is no usual
    answer (pass ``--response-id``).
    """
    from canarchy.isotp import default_response_id as usual

    response_id = usual(arbitration_id) if is_extended_id == (arbitration_id > MAX_STANDARD_ID) else None
    if response_id is None:
        raise UserInputError(
            "INVALID_ARGUMENTS",
            f"There is no default response ID for arbitration ID 0x{arbitration_id:X}.",
            "Pass --response-id with the arbitration ID the target answers on.",
        )
    return response_id


# -- storage --

class FuzzPersistenceError(TransportError):
    """``FUZZ_GUIDED_PERSISTENCE_FAILED`` (exit 2): a findings or corpus file could not be written.

    Transmission stops at once. ``frames_sent``: frames on the bus before the
    stop (also stated in the message); ``path``: the file or directory.
    """

    def __init__(self, path: Path, exc: BaseException, frames_sent: int, iterations: int) -> None:
        super().__init__(
            "FUZZ_GUIDED_PERSISTENCE_FAILED",
            f"Cannot write fuzz findings to {path}: {exc}. Transmission stopped after "
            f"{frames_sent} frame(s) sent ({iterations} iteration(s)).",
            "Pass --findings-dir (or --corpus) pointing at a writable directory; nothing more was sent.",
        )
        self.path = path
        self.frames_sent = frames_sent
        self.iterations = iterations


def new_campaign_id(now: float | None = None) -> str:
    """``YYYYMMDDTHHMMSSZ-<6 hex>``: UTC time plus a random suffix (not from the fuzzing rng)."""
    stamp = datetime.datetime.fromtimestamp(time.time() if now is None else now, datetime.UTC)
    return f"{stamp:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def load_corpus(corpus_dir: Path | None) -> tuple[list[bytes], list[str]]:
    """Read ``*.bin`` entries of ``corpus_dir`` (sorted by name); return ``(entries, warnings)``.

    A missing directory is an empty corpus; an entry that is empty or longer
    than 8 bytes is skipped with a warning.
    """
    if corpus_dir is None or not corpus_dir.is_dir():
        return [], []
    entries: list[bytes] = []
    warnings: list[str] = []
    for path in sorted(corpus_dir.glob("*.bin")):
        try:
            data = path.read_bytes()
        except OSError as exc:
            warnings.append(f"corpus entry {path} skipped: {exc}")
            continue
        if not 1 <= len(data) <= MAX_CLASSIC_DATA:
            warnings.append(f"corpus entry {path} skipped: {len(data)} bytes (a classic CAN frame holds 1-8)")
            continue
        entries.append(data)
    return entries, warnings


def corpus_entry_name(data: bytes) -> str:
    """File name of a corpus entry: ``<sha256 of the bytes, 16 hex>.bin``."""
    return hashlib.sha256(data).hexdigest()[:16] + ".bin"


# -- the campaign --

@dataclass
class CampaignSettings:
    """Everything a campaign needs. Times in seconds, ``rate`` in frames per second."""

    channel: str
    arbitration_id: int
    is_extended_id: bool
    response_id: int
    seed_data: bytes
    rng_seed: int
    findings_root: Path
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    max_seconds: float | None = None
    rate: float = DEFAULT_RATE
    timeout: float = DEFAULT_TIMEOUT
    slow_threshold: float = DEFAULT_SLOW_THRESHOLD
    corpus_dir: Path | None = None
    corpus: list[bytes] = field(default_factory=list)
    backend_name: str = ""


@dataclass
class CampaignResult:
    """Outcome of :func:`run_campaign`; ``findings`` are the finding documents (with ``path``)."""

    campaign_id: str
    campaign_dir: Path
    iterations: int
    frames_sent: int
    markers: list[str]
    stopped_reason: str
    findings: list[dict[str, Any]]
    corpus_size: int
    elapsed: float
    classes: list[str] = field(default_factory=list)
    other_sids: dict[str, list[str]] = field(default_factory=dict)
    late_replies: int = 0


def _campaign_document(settings: CampaignSettings, campaign_id: str, started_at: float) -> dict[str, Any]:
    return {
        "format": 1,
        "campaign_id": campaign_id,
        "command": COMMAND,
        "status": "running",
        "interface": settings.channel,
        "backend": settings.backend_name,
        "arbitration_id": settings.arbitration_id,
        "is_extended_id": settings.is_extended_id,
        "response_id": settings.response_id,
        "seed_data": settings.seed_data.hex(),
        "seed": settings.rng_seed,
        "max_iterations": settings.max_iterations,
        "max_seconds": settings.max_seconds,
        "rate": settings.rate,
        "timeout": settings.timeout,
        "slow_threshold": settings.slow_threshold,
        "corpus_dir": None if settings.corpus_dir is None else str(settings.corpus_dir),
        "started_at": started_at,
        "finished_at": None,
        "iterations": 0,
        "frames_sent": 0,
        "findings_count": 0,
        "markers": [],
        "classes": [],
        "stopped_reason": None,
    }


def _create_campaign_dir(root: Path) -> tuple[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        campaign_id = new_campaign_id()
        path = root / campaign_id
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return campaign_id, path
    raise FileExistsError(f"no free campaign id under {root}")


def _exchange(link: Any, request: CanFrame, accept: Callable[[CanFrame], bool],
              timeout: float) -> tuple[float, list[CanFrame], int]:
    """One request on an open bus: ``(send time, accepted replies, late replies discarded first)``.

    Frames still queued from earlier iterations are discarded before sending
    (those on the response ID counted as late). Replies are collected until
    ``timeout`` passes after the last 0x78 (responsePending), or the first other reply.
    """
    late = 0
    while (stale := link.recv(0)) is not None:
        late += accept(stale)
    sent_at = link.send(request)
    replies: list[CanFrame] = []
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        frame = link.recv(remaining)
        if frame is None:
            break
        if not accept(frame):
            continue
        replies.append(frame)
        if not is_response_pending(frame):
            break
        deadline = time.monotonic() + timeout
    return sent_at, replies, late


def _open_campaign(settings: CampaignSettings, started_wall: float) -> tuple[str, Path, dict[str, Any]]:
    """Create the campaign directory, its ``campaign.json`` and ``corpus_dir``: ``(campaign_id, directory, document)``.

    Raises :class:`FuzzPersistenceError` and leaves no campaign behind when one cannot be written.
    """
    try:
        campaign_id, campaign_dir = _create_campaign_dir(settings.findings_root)
    except OSError as exc:
        raise FuzzPersistenceError(settings.findings_root, exc, 0, 0) from exc
    document = _campaign_document(settings, campaign_id, started_wall)
    target = campaign_dir / "campaign.json"
    try:
        write_json_atomic(target, document)
        if settings.corpus_dir is not None:
            target = settings.corpus_dir
            settings.corpus_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        for leftover in (campaign_dir / "campaign.json", campaign_dir):
            try:  # leave no campaign behind that never sent a frame
                leftover.unlink() if leftover.is_file() else leftover.rmdir()
            except OSError:
                pass
        raise FuzzPersistenceError(target, exc, 0, 0) from exc
    return campaign_id, campaign_dir, document


def _wait_until(due: float, deadline: float | None, clock: Callable[[], float],
                sleep: Callable[[float], None]) -> bool:
    """Sleep until ``due`` (the next iteration's slot, ``clock`` seconds); False when ``deadline`` comes first."""
    now = clock()
    if deadline is not None and now >= deadline:
        return False
    if due > now:
        if deadline is not None and due >= deadline:
            return False
        sleep(due - now)
    return True


def _save_finding(settings: CampaignSettings, generator: InputGenerator, path: Path, finding: dict[str, Any],
                  payload: bytes) -> None:
    """Write ``finding`` to ``path``; when the generator keeps its input, also write it to ``corpus_dir`` (once)."""
    write_json_atomic(path, finding)
    if generator.add(payload, marker_weight(finding["new_markers"])) and settings.corpus_dir is not None:
        path_corpus = settings.corpus_dir / corpus_entry_name(payload)
        if not path_corpus.exists():
            write_bytes_atomic(path_corpus, payload)


def run_campaign(settings: CampaignSettings, backend: Backend,
                 on_finding: Callable[[dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 on_iteration: Callable[[dict[str, Any]], None] | None = None) -> CampaignResult:
    """Run one campaign against ``settings.channel`` on one bus (``backend.session``).

    Creates ``<findings_root>/<campaign_id>/campaign.json`` before the first
    frame, writes a ``finding-<iteration:08d>.json`` (and a corpus entry when
    ``corpus_dir`` is set) for every input with a new novelty key and calls
    ``on_finding`` with it at once; calls ``on_iteration`` after every
    iteration with ``{iterations, frames_sent, findings, elapsed_s}``; rewrites
    ``campaign.json`` at the end. Stops on ``max_iterations``, ``max_seconds``
    or Ctrl+C (``stopped_reason``: ``max_iterations`` / ``max_seconds`` /
    ``interrupted``).

    Raises :class:`FuzzPersistenceError` when a file cannot be written (no
    further frame is sent), ``TransportError`` from the backend.
    """
    frames_sent = 0
    iterations = 0
    late_replies = 0
    campaign_id, campaign_dir, document = _open_campaign(settings, time.time())
    initial = [settings.seed_data, *settings.corpus]
    generator = InputGenerator(initial, settings.rng_seed)
    seeded = seeded_sids(initial)
    seen_markers: set[str] = set()
    seen_keys: set[str] = set()
    other_sids: dict[str, set[str]] = {}
    findings: list[dict[str, Any]] = []
    interval = 1.0 / settings.rate
    start = clock()  # again once the bus is open, where the budget starts
    stopped_reason = "max_iterations"

    def accept(frame: CanFrame) -> bool:
        return frame.arbitration_id == settings.response_id and frame.is_extended_id == (
            settings.response_id > MAX_STANDARD_ID)

    def finish(status: str, reason: str) -> None:
        document.update(status=status, stopped_reason=reason, finished_at=time.time(), iterations=iterations,
                        frames_sent=frames_sent, findings_count=len(findings), markers=sorted(seen_markers),
                        classes=sorted(seen_keys))
        write_json_atomic(campaign_dir / "campaign.json", document)

    def abandon(reason: str) -> None:  # the error that stops the campaign is the one to report
        try:
            finish("failed", reason)
        except OSError:
            pass

    def transport_failed(exc: TransportError) -> TransportError:
        abandon("transport_error")
        return TransportError(exc.code, f"{exc.message} (fuzz campaign {campaign_id}: stopped after "
                                        f"{frames_sent} frame(s) sent)", exc.hint)

    try:
        with ExitStack() as stack:
            try:
                link = stack.enter_context(backend.session(settings.channel))
            except TransportError as exc:  # the bus could not be opened
                raise transport_failed(exc) from exc
            # --max-seconds and the --rate schedule count from the open bus: an adapter slow to open does not
            # use them up (nor send the first requests back to back)
            start = clock()
            deadline = None if settings.max_seconds is None else start + settings.max_seconds
            while iterations < settings.max_iterations:
                if not _wait_until(start + iterations * interval, deadline, clock, sleep):
                    stopped_reason = "max_seconds"
                    break
                payload, parent, ops = generator.next()
                request = CanFrame(settings.arbitration_id, payload, settings.is_extended_id)
                try:
                    sent_at, replies, late = _exchange(link, request, accept, settings.timeout)
                except TransportError as exc:
                    raise transport_failed(exc) from exc
                late_replies += late
                frames_sent += 1
                iterations += 1
                latency = max(0.0, replies[0].timestamp - sent_at) if replies else None
                # The first exchange after opening the bus is a warm-up: its latency is not judged.
                judged = iterations > 1
                markers = markers_for(replies, latency if judged else None, settings.slow_threshold)
                shape = request_shape(payload, seeded)
                keys = novelty_keys(shape, markers)
                seen_markers.update(markers)
                if shape == SHAPE_OTHER_SID:
                    other_sids.setdefault(f"0x{split_single_frame(payload)[0][0]:02X}", set()).update(
                        response_class(marker) for marker in markers)
                new = [key for key in keys if key not in seen_keys]
                if new:
                    seen_keys.update(new)
                    finding = _finding(settings, campaign_id, iterations - 1, sent_at, payload, parent, ops,
                                       markers, shape, keys, new, latency, judged, replies)
                    path = campaign_dir / f"finding-{iterations - 1:08d}.json"
                    try:
                        _save_finding(settings, generator, path, finding, payload)
                    except OSError as exc:
                        abandon("persistence_failed")
                        raise FuzzPersistenceError(path, exc, frames_sent, iterations) from exc
                    finding = dict(finding, path=str(path))
                    findings.append(finding)
                    if on_finding is not None:
                        on_finding(finding)
                if on_iteration is not None:
                    on_iteration({"iterations": iterations, "frames_sent": frames_sent, "findings": len(findings),
                                  "elapsed_s": round(clock() - start, 3)})
    except KeyboardInterrupt:
        stopped_reason = "interrupted"
    try:
        finish("finished", stopped_reason)
    except OSError as exc:
        raise FuzzPersistenceError(campaign_dir / "campaign.json", exc, frames_sent, iterations) from exc
    return CampaignResult(
        campaign_id=campaign_id,
        campaign_dir=campaign_dir,
        iterations=iterations,
        frames_sent=frames_sent,
        markers=sorted(seen_markers),
        stopped_reason=stopped_reason,
        findings=findings,
        corpus_size=len(generator.corpus),
        elapsed=clock() - start,
        classes=sorted(seen_keys),
        other_sids={sid: sorted(classes) for sid, classes in sorted(other_sids.items())},
        late_replies=late_replies,
    )


def _finding(settings: CampaignSettings, campaign_id: str, iteration: int, sent_at: float, payload: bytes,
             parent: bytes | None, ops: list[str], markers: list[str], shape: str, keys: dict[str, str],
             new: list[str], latency: float | None, judged: bool, replies: list[CanFrame]) -> dict[str, Any]:
    """The finding document (``docs/fuzz-guided.md``, Findings layout)."""
    return {
        "campaign_id": campaign_id,
        "iteration": iteration,
        "timestamp": sent_at,
        "arbitration_id": settings.arbitration_id,
        "is_extended_id": settings.is_extended_id,
        "response_id": settings.response_id,
        "data": payload.hex(),
        "parent": None if parent is None else parent.hex(),
        "mutations": ops,
        "markers": markers,
        "new_markers": sorted({keys[key] for key in new}),
        "request_shape": shape,
        "response_classes": sorted(keys),
        "new_classes": sorted(new),
        "latency_s": latency,
        "timing_judged": judged,
        "replies": [{"arbitration_id": f.arbitration_id, "data": f.data.hex(), "timestamp": f.timestamp}
                    for f in replies],
    }
