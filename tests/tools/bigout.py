#!/usr/bin/env python3
"""Command tool for tests/command_tools.rs: prints 5,000,000 bytes of 'x'."""
import sys

chunk = "x" * 100_000
for _ in range(50):
    sys.stdout.write(chunk)
sys.stdout.flush()
