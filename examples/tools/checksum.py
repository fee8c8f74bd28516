#!/usr/bin/env python3
"""checksum: SHA-256 of a file. Arguments on stdin: {"path": "..."}.

Result on stdout: a JSON object (it becomes structuredContent and text).
A missing file exits 1 with the reason on stderr (a result with isError).
"""
import hashlib
import json
import os
import sys

args = json.load(sys.stdin)
path = args["path"]
digest = hashlib.sha256()
size = 0
try:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
except OSError as e:
    print(f"cannot read {path}: {e.strerror}", file=sys.stderr)
    sys.exit(1)
print(json.dumps({"path": os.path.abspath(path), "sha256": digest.hexdigest(), "bytes": size}))
