"""Shared test helpers: run the CLI in-process and read its envelope."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canarchy.cli import main


@dataclass
class CliRun:
    """One in-process CLI run: exit code, stdout text, and (for --json) the envelope."""

    code: int
    out: str

    @property
    def envelope(self) -> dict[str, Any]:
        return json.loads(self.out)

    @property
    def data(self) -> dict[str, Any]:
        return self.envelope["data"]

    @property
    def error_codes(self) -> list[str]:
        return [e["code"] for e in self.envelope["errors"]]


def run_cli(*argv: str) -> CliRun:
    """Run ``canarchy *argv`` in this process."""
    out = io.StringIO()
    code = main(list(argv), stdout=out)
    return CliRun(code, out.getvalue())


def write_user_config(text: str) -> Path:
    """Write ``~/.canarchy/config.toml`` in the (disposable) home of the running test."""
    path = Path.home() / ".canarchy" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
