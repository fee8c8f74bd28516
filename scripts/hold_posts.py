#!/usr/bin/env python3
"""Hold N HTTP/1.1 POSTs open on one server: N connections, each sending
one request (the size of a tasks/result call) and reading the head of its
answer. scripts/bench-waiters uses it on the HTTP stack's floor server
(benches/http_floor.rs), which answers the head of an SSE stream and never
its body. Prints `ready` once every answer's head has come, then holds
them for --hold-secs.

usage: hold_posts.py HOST:PORT N [--hold-secs S]
"""
import argparse
import asyncio
import resource

BODY = b'{"jsonrpc":"2.0","id":1,"method":"tasks/result","params":{"taskId":"00000000-0000-0000-0000-000000000000"}}'


def request(host):
    head = (
        "POST /mcp HTTP/1.1\r\n"
        f"host: {host}\r\n"
        "content-type: application/json\r\n"
        "accept: application/json, text/event-stream\r\n"
        "mcp-protocol-version: 2025-11-25\r\n"
        f"content-length: {len(BODY)}\r\n\r\n"
    )
    return head.encode() + BODY


async def hold(addr, n, hold_secs):
    host, port = addr.rsplit(":", 1)
    data = request(addr)

    async def one():
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(data)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200") or b"text/event-stream" not in head:
            raise SystemExit(f"not the head of an SSE stream: {head!r}")
        return reader, writer

    held = []
    for start in range(0, n, 500):
        held += await asyncio.gather(*[one() for _ in range(min(500, n - start))])
    print("ready", flush=True)
    await asyncio.sleep(hold_secs)
    for _, writer in held:
        writer.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("n", type=int)
    ap.add_argument("--hold-secs", type=float, default=12)
    a = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(hold(a.addr, a.n, a.hold_secs))


if __name__ == "__main__":
    main()
