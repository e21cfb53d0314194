"""The verification lanes: what nox runs (docs/design/verification-harness.md).

- :mod:`.env`: lane environments and the posargs policy (standard library
  only: the one module nox loads, by path);
- :mod:`.runner`: the one way a lane runs pytest; :mod:`.verdict`, :mod:`.results`:
  reading its JUnit report and judging it;
- :mod:`.unit`, :mod:`.parity`, :mod:`.mutation`, :mod:`.order`, :mod:`.selftest`: the lanes;
- ``python -m canarchy.testing.lanes``: their command line.

Imports :mod:`canarchy.testing.isolation`, never the other way round.
"""
