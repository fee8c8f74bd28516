// Load generator of scripts/bench-upstream: calls one tool of an MCP server
// N times, C at a time, and prints one JSON line (calls/s, latency p50/p99
// in ms, errors). Three ways to reach the server:
//
//   direct NODE_SCRIPT    the official TypeScript SDK client over stdio to
//                         the server itself (the baseline: no broker);
//   direct URL            the same client over Streamable HTTP to the server
//                         itself, when it serves that transport;
//   plain URL             the same client over Streamable HTTP to a broker
//                         that serves the server's tools (a plain call);
//   task URL              a task-augmented call (MCP 2025-11-25) to the
//                         broker, then tasks/result, which answers when the
//                         task is done; one latency is both requests.
//
// usage: node bench_upstream.mjs MODE TARGET --tool T --args JSON --calls N --concurrency C
// The SDK is the one tests/upstream installs (SDK_DIR: its dist/esm).
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";

const [mode, target, ...rest] = process.argv.slice(2);
const { values } = parseArgs({
  args: rest,
  options: {
    tool: { type: "string", default: "get-sum" },
    args: { type: "string", default: '{"a":2,"b":3}' },
    calls: { type: "string", default: "2000" },
    concurrency: { type: "string", default: "8" },
    warmup: { type: "string", default: "100" },
  },
});
// undici (the SDK's fetch) warns at every request once 1,500 abort
// listeners wait on a transport's one AbortSignal (they go when collected):
// each kind of warning is said once.
process.removeAllListeners("warning");
const warned = new Set();
process.on("warning", (w) => {
  if (!warned.has(w.name)) {
    warned.add(w.name);
    console.error(`${w.name}: ${w.message} (said once)`);
  }
});
const sdk = process.env.SDK_DIR;
const { Client } = await import(`${sdk}/client/index.js`);
const { StdioClientTransport } = await import(`${sdk}/client/stdio.js`);
const { StreamableHTTPClientTransport } = await import(`${sdk}/client/streamableHttp.js`);

const tool = values.tool;
const args = JSON.parse(values.args);
const calls = Number(values.calls);
const concurrency = Number(values.concurrency);

/** One call of the tool in the chosen mode; throws when it fails. */
let callOnce;
let close = async () => {};
if (mode === "direct" || mode === "plain") {
  const client = new Client({ name: "bench-upstream", version: "0" });
  const http = mode === "plain" || /^https?:\/\//.test(target);
  const transport = http
    ? new StreamableHTTPClientTransport(new URL(target))
    : new StdioClientTransport({ command: "node", args: [target], stderr: "ignore" });
  await client.connect(transport);
  callOnce = async () => {
    const r = await client.callTool({ name: tool, arguments: args });
    if (r.isError) throw new Error(JSON.stringify(r));
  };
  close = async () => {
    // A server over HTTP keeps a session (and what it kept for it) until
    // told to end it; the next run starts its own.
    if (mode === "direct" && http) await transport.terminateSession().catch(() => {});
    await client.close();
  };
} else if (mode === "task") {
  const headers = {
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
  };
  let id = 0;
  const post = async (method, params) => {
    const res = await fetch(target, {
      method: "POST",
      headers,
      body: JSON.stringify({ jsonrpc: "2.0", id: ++id, method, params }),
    });
    const text = await res.text();
    // JSON, or an SSE stream whose last data line is the answer.
    const body = res.headers.get("content-type")?.includes("text/event-stream")
      ? text.split("\n").filter((l) => l.startsWith("data:")).pop().slice(5)
      : text;
    const message = JSON.parse(body);
    if (message.error) throw new Error(JSON.stringify(message.error));
    return { res, result: message.result };
  };
  const init = await post("initialize", {
    protocolVersion: "2025-11-25",
    capabilities: {},
    clientInfo: { name: "bench-upstream", version: "0" },
  });
  headers["mcp-session-id"] = init.res.headers.get("mcp-session-id");
  headers["mcp-protocol-version"] = "2025-11-25";
  await fetch(target, {
    method: "POST",
    headers,
    body: JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }),
  });
  callOnce = async () => {
    const created = await post("tools/call", { name: tool, arguments: args, task: { ttl: 600000 } });
    const taskId = created.result.task.taskId;
    const done = await post("tasks/result", { taskId });
    if (done.result.isError) throw new Error(JSON.stringify(done.result));
  };
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}

/** Run `n` calls, `c` at a time; the latency of each (ms) and the errors. */
async function run(n, c) {
  const latencies = [];
  let errors = 0;
  let next = 0;
  const lane = async () => {
    while (next < n) {
      next += 1;
      const t0 = performance.now();
      try {
        await callOnce();
        latencies.push(performance.now() - t0);
      } catch (e) {
        errors += 1;
        if (errors <= 3) console.error(String(e));
      }
    }
  };
  await Promise.all(Array.from({ length: c }, lane));
  return { latencies, errors };
}

await run(Number(values.warmup), concurrency);
const t0 = performance.now();
const { latencies, errors } = await run(calls, concurrency);
const seconds = (performance.now() - t0) / 1000;
latencies.sort((a, b) => a - b);
const at = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))];
console.log(
  JSON.stringify({
    mode,
    tool,
    calls,
    concurrency,
    errors,
    calls_per_s: latencies.length / seconds,
    p50_ms: at(0.5),
    p99_ms: at(0.99),
  }),
);
await close();
process.exit(0);
