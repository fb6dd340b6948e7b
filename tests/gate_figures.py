"""Accuracy-gate figures the tests measured, printed at the end of the run (tests/conftest.py)."""

LINES: list[str] = []
