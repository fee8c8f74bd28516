#!/bin/sh
# Command tool for tests/command_tools.rs: a process tree. The script (the
# leader) starts a subshell (child) that starts `sleep 60` in the background
# (grandchild) and sleeps itself; the three pids go to files in the working
# directory. Then everything waits.
name="tree.$TASKBROKER_TASK_ID"
(
    sleep 60 &
    echo $! > "$name.grandchild.tmp" && mv "$name.grandchild.tmp" "$name.grandchild"
    sleep 60
) &
echo $! > "$name.child.tmp" && mv "$name.child.tmp" "$name.child"
echo $$ > "$name.leader.tmp" && mv "$name.leader.tmp" "$name.leader"
wait
echo "tree done"
