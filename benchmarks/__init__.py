"""canarchy's benchmarks (``nox -s bench``; ``docs/benchmarks.md``).

Run from the checkout's root, in one process so that the figures are
comparable as ratios::

    python -m benchmarks                       # every section, reports/bench.md
    python -m benchmarks --sections startup    # one section

Sections (one module each):

- :mod:`benchmarks.isolation`: what canarchy's pytest isolation costs per test,
  beside bare pytest and a naive per-test ``HOME`` fixture;
- :mod:`benchmarks.lane_times`: wall time of the nox lanes (warm, and a cold
  ``nox -s unit`` in a fresh clone);
- :mod:`benchmarks.captures`: frames per second reading and decoding a
  1,000,000-frame candump log, beside python-can's reader and cantools;
- :mod:`benchmarks.startup`: wall time of offline commands from process start
  to exit, beside ``import can`` and ``cantools --help``.
- :mod:`benchmarks.sentinel`: what the sentinel's tree manifest costs as the
  checkout and the home grow (ignored and tracked files, a large file).

Nothing here is a test: the suite (``tests/test_benchmarks.py``) checks the
code of the benchmarks, never a timing.
"""
