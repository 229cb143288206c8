"""Helpers shared by the test packages (and the benchmarks): no tests and no fixtures here
(fixtures stay in conftest.py files, where pytest finds them)."""
