"""canarchy's hermetic test machinery and verification harness.

- :mod:`canarchy.testing.isolation.guard`: the CAN bus guard (no pytest dependency, so a
  child Python process can install it too).
- :mod:`canarchy.testing.isolation.sandbox`: the disposable home, the environment scrub,
  the re-pointing of import-time paths and the operator-state manifest.
- :mod:`canarchy.testing.isolation.plugin`: the pytest plugin that wires both into a run.
  It is activated explicitly, by ``pytest_plugins = ["canarchy.testing.isolation.plugin"]``
  in a conftest.py, never by an entry point, so installing canarchy changes no
  other project's test runs.
"""
