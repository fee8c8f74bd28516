#!/usr/bin/env python3
"""Command tool for tests/command_tools.rs: reports on TASKBROKER_EVENTS_FD.

Arguments (all optional):
  start_delay  seconds to wait before the first event (default 0)
  steps        progress lines to write (default 3), "step i of n"
  delay        seconds between progress lines (default 0.3)
  log          a log line to write first (level info), plus a debug one
  status       a status line to write after the progress lines
  end_delay    seconds to wait before ending (default 0)
"""
import json
import os
import sys
import time

args = json.load(sys.stdin)
events = os.fdopen(int(os.environ["TASKBROKER_EVENTS_FD"]), "w", buffering=1)


def emit(event):
    events.write(json.dumps(event) + "\n")
    events.flush()


time.sleep(args.get("start_delay", 0))
if args.get("log") is not None:
    emit({"log": "debug detail nobody asked for", "level": "debug"})
    emit({"log": args["log"], "level": "info"})
steps = args.get("steps", 3)
for i in range(1, steps + 1):
    emit({"progress": i, "total": steps, "message": f"step {i} of {steps}"})
    time.sleep(args.get("delay", 0.3))
if args.get("status") is not None:
    emit({"status": args["status"]})
time.sleep(args.get("end_delay", 0))
print(f"done after {steps} steps")
