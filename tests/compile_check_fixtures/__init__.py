"""Triton modules with planted defects for tests/test_compile_check.py (imported by its worker processes)."""
