#!/bin/sh
# Command tool for tests/command_tools.rs: prints what it was given (task id,
# attempt, tool name, working directory, the config's env GREETING and the
# JSON arguments on stdin).
args=$(cat)
printf 'task=%s attempt=%s tool=%s cwd=%s greeting=%s args=%s\n' \
    "$TASKBROKER_TASK_ID" "$TASKBROKER_ATTEMPT" "$TASKBROKER_TOOL" "$(pwd -P)" \
    "$GREETING" "$args"
