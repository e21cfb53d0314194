"""A pytest plugin for the order lane: ``-p canarchy.testing.lanes.reverse`` runs the tests backwards.

(Seeded shuffles come from pytest-randomly; this is the one order it lacks.)
Modules stay contiguous, so module-scoped fixtures are set up once per module.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)  # after deselection: deselected tests stay out
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.reverse()
