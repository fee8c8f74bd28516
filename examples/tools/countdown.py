#!/usr/bin/env python3
"""countdown: count down from {"seconds": n}, reporting progress each second
on the events descriptor (TASKBROKER_EVENTS_FD), then print a line."""
import json
import os
import sys
import time

seconds = int(json.load(sys.stdin)["seconds"])
fd = os.environ.get("TASKBROKER_EVENTS_FD")
events = os.fdopen(int(fd), "w", buffering=1) if fd else None


def event(**fields):
    if events:
        events.write(json.dumps(fields) + "\n")


event(status=f"counting down from {seconds}")
for done in range(1, seconds + 1):
    time.sleep(1)
    event(progress=done, total=seconds, message=f"{seconds - done} s left")
print(f"countdown from {seconds} finished (task {os.environ.get('TASKBROKER_TASK_ID') or '-'}, attempt {os.environ.get('TASKBROKER_ATTEMPT')})")
