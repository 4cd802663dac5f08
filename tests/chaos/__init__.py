"""The chaos harness (harness.py says what runs and what it checks): the short runs
in tests/process/test_chaos.py, and long ones from the command line, bench/chaos.py."""
