"""One shard of a pytest run: ``-p canarchy.testing.lanes.shard --canarchy-shard=I/N`` keeps the
collection's tests I, I+N, I+2N ... (I from 0) and deselects the others, after every other plugin
has chosen and ordered them. N processes started alike, one per shard, run each test once; a
test keeps its place relative to the others of its shard. Standard library and pytest only.
"""

from __future__ import annotations

import pytest

OPTION = "--canarchy-shard"


def parse(spec: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)``; ``ValueError`` unless 0 <= I < N."""
    index, _, count = spec.partition("/")
    if index.isdigit() and count.isdigit() and int(index) < int(count):
        return int(index), int(count)
    raise ValueError(f"{OPTION}={spec}: give I/N, whole numbers with 0 <= I < N")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, dest="canarchy_shard", metavar="I/N", default=None,
                     help="run only the shard I (from 0) of N: every Nth test of the collection")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("canarchy_shard")
    if spec is None:
        return
    try:
        index, count = parse(spec)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    dropped = [item for i, item in enumerate(items) if i % count != index]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = items[index::count]
