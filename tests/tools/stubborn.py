#!/usr/bin/env python3
"""Command tool for tests/command_tools.rs: ignores SIGTERM (and so does the
child it starts), writes both pids to files in its working directory, then
sleeps for a minute. Only SIGKILL stops it."""
import os
import signal
import subprocess
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
# The child inherits the ignored disposition across exec.
child = subprocess.Popen(["sleep", "60"])
name = "stubborn." + os.environ.get("TASKBROKER_TASK_ID", "")
for suffix, pid in (("child", child.pid), ("pid", os.getpid())):
    with open(f"{name}.{suffix}.tmp", "w") as f:
        f.write(f"{pid}\n")
    os.rename(f"{name}.{suffix}.tmp", f"{name}.{suffix}")
time.sleep(60)
print("survived")
