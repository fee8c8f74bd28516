#!/usr/bin/env python3
"""Command tool for tests/command_tools.rs: prints JSON on stdout.

{"kind": "content"} prints a whole CallToolResult, {"kind": "object"} a plain
object, {"kind": "array"} an array.
"""
import json
import sys

kind = json.load(sys.stdin)["kind"]
if kind == "content":
    out = {
        "content": [
            {"type": "text", "text": "first block"},
            {"type": "text", "text": "second block"},
        ],
        "structuredContent": {"from": "the tool"},
    }
elif kind == "object":
    out = {"answer": 42, "nested": {"list": [1, 2, 3], "ok": True}}
else:
    out = [1, 2, 3]
print(json.dumps(out))
