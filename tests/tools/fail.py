#!/usr/bin/env python3
"""Command tool for tests/command_tools.rs: writes to stderr and exits 3.

With {"big": true} it first writes well over 4 KiB of noise to stderr, so
only its tail can be kept.
"""
import json
import sys

args = json.load(sys.stdin)
print("some stdout that is not the result")
sys.stderr.write("FIRST-LINE-MARKER\n")
if args.get("big"):
    for i in range(1000):
        sys.stderr.write(f"noise line {i:04}\n")
sys.stderr.write("disk is full: cannot write /nowhere/out.bin\n")
sys.exit(3)
