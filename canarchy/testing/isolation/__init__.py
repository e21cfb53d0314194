"""The hermetic pytest plugin: what a project's pytest loads (guards, sandbox, containment).

Never imports :mod:`canarchy.testing.lanes`.
"""
