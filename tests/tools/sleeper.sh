#!/bin/sh
# Command tool for tests/command_tools.rs: writes its pid and its child's pid
# to files in its working directory, then waits 30 s for the child.
name="sleeper.${TASKBROKER_TASK_ID:-plain}"
sleep 30 &
echo $! > "$name.child.tmp" && mv "$name.child.tmp" "$name.child"
echo $$ > "$name.pid.tmp" && mv "$name.pid.tmp" "$name.pid"
wait
echo "slept"
