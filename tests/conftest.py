"""The suite runs under canarchy's hermetic plugin: see docs/design/test-isolation.md."""

pytest_plugins = ["canarchy.testing.plugin"]
