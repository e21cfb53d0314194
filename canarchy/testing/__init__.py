"""canarchy's test machinery, in two parts (docs/design/tree.md maps them):

- :mod:`canarchy.testing.isolation`: the hermetic pytest plugin a project's pytest loads, with
  ``-p canarchy.testing.isolation.plugin`` (its ``addopts``) or ``pytest_plugins`` in a conftest,
  never by an entry point: installing canarchy changes no other project's runs;
- :mod:`canarchy.testing.lanes`: the verification lanes nox runs.
"""
