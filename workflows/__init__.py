"""Workflow code only: deterministic, no I/O."""
