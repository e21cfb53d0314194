"""canarchy.testing: the hermetic pytest plugin and the verification harness logic."""
