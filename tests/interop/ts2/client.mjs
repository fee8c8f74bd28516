// Interoperability: the TypeScript MCP client 2.x (@modelcontextprotocol/client
// 2.4, which speaks 2026-07-28) with the generation-agnostic tasks package
// (@modelcontextprotocol/ext-tasks 0.2), against a broker whose tools run in
// a separate `taskbroker worker` process.
//
// usage: node client.mjs path/to/taskbroker
//
// Starts its own processes in a fresh temporary directory:
//   taskbroker serve  --workers 0 --db DIR/b.db --listen 127.0.0.1:0
//   taskbroker worker --db DIR/b.db --lease 5
// (default settings: not --strict-headers) and kills them at the end.
//
// The same checks run twice, once per protocol generation of the broker:
//   2026-07-28  Client({versionNegotiation: {mode: "auto"}}) probes
//               server/discover; ext-tasks drives tools/call and tasks/*
//               through the host's raw dispatcher (client 2.4's request()
//               cannot carry the 2026 task shapes: see README), tasks/get
//               polling, inputRequests answered with tasks/update
//   2025-11-25  Client() with initialize; ext-tasks adds params.task
//               (task preference "prefer"), polls tasks/get, reads
//               tasks/result, and answers the elicitation the broker sends
//               on a tasks/result stream (which the test has to open: see
//               askedOverTasksResult)
// Checks per generation: a tool called as a task polled to its result; a
// cancel of a running task; an input request answered (accept, decline); a
// failing tool; a kill -9 of the server while a task runs in the worker, a
// restart on the same database and port, and the task's result obtained
// through session.resumeTask(serialized reference) (2026-07-28: by a new
// Client; 2025-11-25: by the same Client, whose session the database kept).
// The worker's log shows that it, not the server, ran each tool.
//
// Every check prints `ok - ...` or `not ok - ...`; the last line is
// `N passed, M failed`; exit status 0 only when M is 0.

import { spawn } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import {
  createTaskSessionFromClient,
  resultFromTaskOutcome,
  TaskCancelledError,
  toolDeclarationFromMcpTool,
} from "@modelcontextprotocol/ext-tasks/client";

const MODERN = "2026-07-28";
const LEGACY = "2025-11-25";
const TOTAL_TIMEOUT_MS = 100_000;

let passed = 0;
let failed = 0;

class CheckFailed extends Error {
  constructor(what, details = "") {
    super(what);
    this.details = typeof details === "string" ? details : JSON.stringify(details);
  }
}

function expect(cond, what, details = "") {
  if (!cond) throw new CheckFailed(what, details);
}

function ok(what) {
  passed += 1;
  console.log(`ok - ${what}`);
}

function notOk(what, details) {
  failed += 1;
  console.log(`not ok - ${what}`);
  for (const line of String(details).split("\n")) if (line) console.log(`#   ${line}`);
}

async function until(cond, what, ms = 10_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await cond();
    if (value) return value;
    if (Date.now() > deadline) throw new CheckFailed(`${what}: not within ${ms / 1000} s`);
    await sleep(50);
  }
}

// ------------------------------------------------------------------ processes

class Broker {
  constructor(binary) {
    this.binary = binary;
    this.dir = mkdtempSync(join(tmpdir(), "taskbroker-ts2-"));
    this.db = join(this.dir, "b.db");
    this.server = null;
    this.worker = null;
    this.port = 0;
    this.url = "";
    this.starts = 0;
  }

  log(name) {
    return openSync(join(this.dir, `${name}.log`), "a");
  }

  async startServer(port = 0) {
    const deadline = Date.now() + 10_000;
    for (;;) {
      this.starts += 1;
      const out = join(this.dir, `server-${this.starts}.out`);
      const proc = spawn(
        this.binary,
        ["serve", "--workers", "0", "--db", this.db, "--listen", `127.0.0.1:${port}`],
        { stdio: ["ignore", openSync(out, "w"), this.log("server")] },
      );
      this.server = proc;
      let exited = false;
      proc.on("exit", () => { exited = true; });
      while (!exited && Date.now() < deadline) {
        const line = readFileSync(out, "utf8").split("\n").find((l) => l.startsWith("taskbroker listening on "));
        if (line) {
          this.url = line.slice("taskbroker listening on ".length).trim();
          this.port = Number(new URL(this.url).port);
          return this.url;
        }
        await sleep(50);
      }
      if (!exited) proc.kill("SIGKILL");
      if (port === 0 || Date.now() >= deadline) throw new CheckFailed("the server did not start", this.tail("server"));
      await sleep(200); // the old socket may linger: bind again
    }
  }

  async startWorker() {
    const log = this.log("worker");
    this.worker = spawn(this.binary, ["worker", "--db", this.db, "--lease", "5"], { stdio: ["ignore", log, log] });
    let exited = false;
    this.worker.on("exit", () => { exited = true; });
    this.workerAlive = () => !exited;
    // The worker prints its start to its log once it has registered.
    await until(() => {
      expect(!exited, "the worker exited at start", this.tail("worker"));
      return this.tail("worker").length > 40;
    }, "the worker did not start");
  }

  async killServer() {
    const proc = this.server;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise((r) => proc.on("exit", r));
    proc.kill("SIGKILL");
    await gone;
  }

  tail(name, lines = 12) {
    try {
      const text = readFileSync(join(this.dir, `${name}.log`), "utf8").split("\n").slice(-lines - 1);
      return `last lines of the ${name} log:\n` + text.map((t) => `  ${t}`).join("\n");
    } catch {
      return `(${name} log unreadable)`;
    }
  }

  cleanup() {
    for (const proc of [this.server, this.worker]) if (proc && proc.exitCode === null) proc.kill("SIGKILL");
    rmSync(this.dir, { recursive: true, force: true });
  }
}

// ------------------------------------------------------------------ the client

// What went over the wire: [mcp-method header, the MCP headers] per POST.
const sent = [];

async function recordingFetch(url, init = {}) {
  if ((init.method ?? "GET") === "POST") {
    const headers = Object.fromEntries(
      [...new Headers(init.headers ?? {}).entries()].filter(([k]) => k.startsWith("mcp")),
    );
    let method = headers["mcp-method"];
    if (!method) {
      try { method = JSON.parse(init.body).method; } catch { method = "?"; }
    }
    sent.push([method, headers]);
  }
  return fetch(url, init);
}

// The host's raw dispatcher that ext-tasks needs for 2026-07-28 task traffic
// (tools/call and tasks/*): one POST per request, with the 2026 headers; the
// answer is JSON or an SSE stream whose last message is the response.
function rawDispatcher(url) {
  let nextId = 1;
  return async (request, options = {}) => {
    const body = { jsonrpc: "2.0", id: `raw-${nextId++}`, ...request };
    const headers = new Headers({
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": MODERN,
      "mcp-method": body.method,
    });
    if (body.method === "tools/call") headers.set("mcp-name", body.params.name);
    // ext-tasks passes its own headers: Mcp-Name (the taskId) on tasks/*.
    for (const [name, value] of Object.entries(options.context?.headers ?? {})) headers.set(name, value);
    const res = await recordingFetch(url, {
      method: "POST", headers, body: JSON.stringify(body), signal: options.signal,
    });
    const text = await res.text();
    let message;
    if ((res.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
      const data = text.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).filter(Boolean);
      message = data.map((d) => JSON.parse(d)).find((m) => m.id === body.id);
    } else {
      message = JSON.parse(text);
    }
    if (!message) throw new Error(`no response to ${body.method} (HTTP ${res.status}): ${text.slice(0, 300)}`);
    return message.error ? { kind: "error", error: message.error } : { kind: "result", result: message.result };
  };
}

const CLIENT_INFO = { name: "taskbroker-interop-ts2", version: "1" };
const CAPABILITIES = { elicitation: { form: {} } };

// The application's answers to input requests, and what it was asked.
const asker = {
  questions: [],
  answer: { action: "accept", content: { approved: true } },
  async handle(request, context) {
    asker.questions.push({ request, context });
    return asker.answer;
  },
};

async function connect(url, generation) {
  const client = new Client(CLIENT_INFO, {
    capabilities: CAPABILITIES,
    ...(generation === MODERN ? { versionNegotiation: { mode: "auto" } } : {}),
  });
  const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: recordingFetch });
  await client.connect(transport);
  const tools = (await client.listTools()).tools;
  const declarations = new Map(tools.map((t) => [t.name, toolDeclarationFromMcpTool(t)]));
  const session = createTaskSessionFromClient(client, {
    endpointId: `taskbroker-${generation}`,
    tools: { currentTool: (name) => declarations.get(name) },
    onInputRequest: asker.handle,
    ...(generation === MODERN
      ? {
        rawDispatch: rawDispatcher(url),
        v2RequestFraming: { protocolVersion: MODERN, clientInfo: CLIENT_INFO, clientCapabilities: CAPABILITIES },
      }
      : {}),
  });
  return { client, session, tools };
}

async function close({ client, session }) {
  await session.close();
  await client.close();
}

// ext-tasks calls a taskSupport "optional" tool as a 2025-11-25 task only when asked to.
const PREFER_TASK = { task: { preference: "prefer" } };

// A failed outcome's error with its causes, for messages.
function showOutcome(outcome) {
  const causes = [];
  for (let e = outcome?.error; e; e = e.cause) causes.push(`${e.name}: ${e.message}${e.code ? ` (${e.code})` : ""}`);
  return JSON.stringify({ status: outcome?.status, causes, result: outcome?.result, task: outcome?.task?.raw });
}

const texts = (result) => (result?.content ?? []).map((c) => c.text);

// ------------------------------------------------------------------ the checks

async function group(name, body) {
  try {
    await Promise.race([
      body(),
      sleep(40_000).then(() => { throw new CheckFailed("took longer than 40 s"); }),
    ]);
  } catch (e) {
    const details = e instanceof CheckFailed ? e.details : (e?.stack ?? String(e));
    notOk(`${name}: ${e?.message ?? e}`, `${details}\n${broker.tail("server", 6)}\n${broker.tail("worker", 6)}`);
  }
}

async function discover(generation, conn) {
  const era = conn.client.getProtocolEra();
  expect(era === (generation === MODERN ? "modern" : "legacy"), `the client speaks ${generation}`, String(era));
  const caps = conn.client.getServerCapabilities();
  const tasks = generation === MODERN ? caps?.extensions?.["io.modelcontextprotocol/tasks"] : caps?.tasks;
  expect(tasks !== undefined, "the server declares tasks", caps);
  expect(conn.session.capabilities.execution, "ext-tasks sees task execution", conn.session.capabilities);
  const names = conn.tools.map((t) => t.name);
  expect(["sleep", "approve", "fail"].every((n) => names.includes(n)), "tools/list has sleep, approve, fail", names);
  ok(`${generation}: connected (era ${era}), ext-tasks capabilities ${JSON.stringify(conn.session.capabilities)},`
    + ` ${names.length} tools`);
}

// Waits until the worker process has started the task's job (serve has
// --workers 0: nothing else runs tools) and tasks/get says working.
async function running(session, taskId) {
  await until(() => broker.tail("worker", 200).includes(`job started task_id=${taskId}`),
    `the worker starts task ${taskId}`);
  const view = await session.task(taskId).snapshot();
  expect(view.status === "working", "tasks/get: working while the worker runs it", view);
  return view;
}

async function completed(generation, { session }) {
  const execution = await session.callTool("sleep", { seconds: 1, message: `ts2 ${generation}` }, PREFER_TASK);
  expect(execution.kind === "task", "sleep runs as a task", execution.kind);
  const events = [];
  const { outcome } = await execution.settle({ onEvent: (e) => { events.push(e); } });
  expect(outcome.status === "completed", "the task completes", showOutcome(outcome));
  const result = resultFromTaskOutcome(outcome);
  expect(JSON.stringify(texts(result)) === JSON.stringify([`ts2 ${generation}`]), "the result text", result);
  const statuses = events.filter((e) => e.type === "task").map((e) => e.task.status);
  const gets = sent.filter(([m]) => m === "tasks/get").length;
  ok(`${generation}: sleep 1 s as task ${execution.handle.taskId}: statuses [${statuses}], completed,`
    + ` result ${JSON.stringify(texts(result))} (tasks/get sent so far: ${gets})`);
}

async function cancel(generation, { session }) {
  const execution = await session.callTool("sleep", { seconds: 30 }, PREFER_TASK);
  expect(execution.kind === "task", "sleep runs as a task", execution.kind);
  const taskId = execution.handle.taskId;
  const view = await running(session, taskId);
  await execution.cancel();
  const { outcome } = await execution.settle();
  expect(outcome.status === "cancelled", "the task ends cancelled", outcome);
  let threw = null;
  try { resultFromTaskOutcome(outcome); } catch (e) { threw = e; }
  expect(threw instanceof TaskCancelledError, "resultFromTaskOutcome throws TaskCancelledError", String(threw));
  const after = await session.task(taskId).snapshot();
  expect(after.status === "cancelled", "a later tasks/get says cancelled", after);
  ok(`${generation}: task ${taskId} running in the worker (${view.status}): cancel -> cancelled,`
    + " TaskCancelledError, stays cancelled");
}

// 2025-11-25 delivers a task's question on the tasks/result stream, and the
// spec says a requestor that sees input_required SHOULD call tasks/result
// then. ext-tasks 0.2.2 polls tasks/get until the task ends and calls
// tasks/result only after (its execution and TaskController.result() alike),
// so alone it waits forever. The test makes that one tasks/result call itself
// through the SDK client; the request on its stream goes to ext-tasks' input
// routing (the Client's fallback request handler) and so to onInputRequest.
async function askedOverTasksResult(generation, { client, session }, taskId) {
  if (generation !== LEGACY) return "";
  await until(async () => (await session.task(taskId).snapshot()).status === "input_required",
    `task ${taskId} input_required`);
  // tasks/result is no method of the 2.x client's own (it is 2025-11-25
  // only): any result goes, in a Standard Schema that takes everything.
  const anyResult = { "~standard": { version: 1, vendor: "taskbroker-interop", validate: (value) => ({ value }) } };
  const result = await client.request({ method: "tasks/result", params: { taskId } }, anyResult);
  return ` (tasks/result sent by the test, not ext-tasks: ${JSON.stringify(texts(result))})`;
}

async function inputRequest(generation, conn) {
  const { session } = conn;
  const before = asker.questions.length;
  asker.answer = { action: "accept", content: { approved: true } };
  const execution = await session.callTool("approve", { question: `ts2 ${generation}?` }, PREFER_TASK);
  expect(execution.kind === "task", "approve runs as a task", execution.kind);
  const settling = execution.settle();
  const note = await askedOverTasksResult(generation, conn, execution.handle.taskId);
  const { outcome } = await settling;
  expect(outcome.status === "completed", "the task completes", showOutcome(outcome));
  const asked = asker.questions.slice(before);
  expect(asked.length === 1, "the input handler was asked once", asked);
  const { request, context } = asked[0];
  expect(request.kind === "elicitation" && request.params.message === `ts2 ${generation}?`,
    "an elicitation with the question", request);
  const result = resultFromTaskOutcome(outcome);
  expect(JSON.stringify(texts(result)) === '["approved"]', "the result is 'approved'", result);
  ok(`${generation}: approve as task ${execution.handle.taskId}: the handler got ${request.kind}`
    + ` (${context.delivery}, task ${context.taskId === execution.handle.taskId ? "matches" : context.taskId}),`
    + ` answered accept, result ${JSON.stringify(texts(result))}${note}`);
  asker.answer = { action: "decline" };
  const declined = await session.callTool("approve", { question: "decline me" }, PREFER_TASK);
  const declining = declined.settle();
  await askedOverTasksResult(generation, conn, declined.handle.taskId);
  const settled = await declining;
  const declinedResult = resultFromTaskOutcome(settled.outcome);
  expect(JSON.stringify(texts(declinedResult)) === '["the user declined to answer"]', "a decline reaches the tool",
    declinedResult);
  ok(`${generation}: a declined elicitation: ${JSON.stringify(texts(declinedResult))}`);
}

async function failing(generation, { session }) {
  const execution = await session.callTool("fail", { message: `ts2 ${generation} failed` }, PREFER_TASK);
  expect(execution.kind === "task", "fail runs as a task", execution.kind);
  const { outcome, lastTask } = await execution.settle();
  if (generation === MODERN) {
    // 2026-07-28: a tool's isError result is the completed task's result.
    expect(outcome.status === "completed" && outcome.result.isError === true, "completed with isError", outcome);
    expect(JSON.stringify(texts(outcome.result)) === JSON.stringify([`ts2 ${generation} failed`]), "the text", outcome);
    ok(`${generation}: fail as a task: completed, result.isError true, ${JSON.stringify(texts(outcome.result))}`);
  } else {
    // 2025-11-25: the task is failed. (ext-tasks then reports the task's
    // statusMessage and does not read tasks/result, which holds the isError
    // result.)
    expect(outcome.status === "failed", "the outcome is failed", showOutcome(outcome));
    const shown = outcome.error.message;
    expect(shown.includes(`ts2 ${generation} failed`), "the tool's message reaches the outcome", shown);
    expect(lastTask?.status === "failed", "the task's status is failed", lastTask);
    ok(`${generation}: fail as a task: task status ${lastTask?.status}, outcome ${outcome.status}:`
      + ` ${JSON.stringify(shown)}`);
  }
}

async function restart(generation) {
  let conn = await connect(broker.url, generation);
  const execution = await conn.session.callTool("sleep", { seconds: 4, message: "survived" }, PREFER_TASK);
  expect(execution.kind === "task", "sleep runs as a task", execution.kind);
  const reference = execution.serializeReference();
  await running(conn.session, reference.taskId);
  await execution.detach();
  await broker.killServer();
  ok(`${generation}: task ${reference.taskId} running in the worker, reference ${JSON.stringify(reference)};`
    + " server SIGKILLed");
  const port = broker.port;
  await broker.startServer(port);
  expect(broker.port === port, "the server came back on the same port", broker.url);
  expect(broker.workerAlive(), "the worker process is still alive");
  if (generation === MODERN) {
    // Stateless: a new Client (a new process, say) picks the task up.
    try { await close(conn); } catch { /* its server is gone */ }
    conn = await connect(broker.url, generation);
  }
  // 2025-11-25: a task belongs to its session, which lives in the database:
  // the same Client (same Mcp-Session-Id) goes on. (A new Client given the
  // session id skips initialize and so knows no server capabilities:
  // ext-tasks then sees no tasks support.)
  try {
    const resumed = await conn.session.resumeTask(reference);
    const { outcome } = await resumed.settle();
    expect(outcome.status === "completed", "the resumed task completes", showOutcome(outcome));
    const result = resultFromTaskOutcome(outcome);
    expect(JSON.stringify(texts(result)) === '["survived"]', "the result after the restart", result);
    ok(`${generation}: restarted on the same db and port; ${generation === MODERN ? "a new" : "the same"} Client`
      + ` resumed the reference:`
      + ` ${JSON.stringify(texts(result))}`);
  } finally {
    await close(conn);
  }
}

async function run(generation) {
  let conn;
  try {
    conn = await connect(broker.url, generation);
  } catch (e) {
    notOk(`${generation}: connect`, e?.stack ?? String(e));
    return;
  }
  await group(`${generation} discover`, () => discover(generation, conn));
  await group(`${generation} task polled to the end`, () => completed(generation, conn));
  await group(`${generation} cancel`, () => cancel(generation, conn));
  await group(`${generation} input request`, () => inputRequest(generation, conn));
  await group(`${generation} failing tool`, () => failing(generation, conn));
  await close(conn);
  await group(`${generation} kill -9 and restart`, () => restart(generation));
}

function headerSummary() {
  const modern = sent.filter(([, h]) => h["mcp-protocol-version"] === MODERN);
  const withoutMethod = modern.filter(([, h]) => !h["mcp-method"]);
  const withoutName = [...new Set(modern.filter(([m, h]) => (m === "tools/call" || m.startsWith("tasks/"))
    && !h["mcp-name"]).map(([m]) => m))];
  ok(`2026-07-28 headers: ${modern.length} POSTs with MCP-Protocol-Version, ${withoutMethod.length} without`
    + ` Mcp-Method, Mcp-Name missing on: ${withoutName.length ? withoutName.join(", ") : "none"}`);
}

const binary = process.argv[2];
if (!binary) {
  console.error("usage: node client.mjs path/to/taskbroker");
  process.exit(2);
}
const broker = new Broker(resolve(binary));
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => { broker.cleanup(); process.exit(130); });
}
const timer = setTimeout(() => {
  notOk(`the whole run took longer than ${TOTAL_TIMEOUT_MS / 1000} s`, "");
  broker.cleanup();
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(1);
}, TOTAL_TIMEOUT_MS);
try {
  await broker.startServer();
  await broker.startWorker();
  ok(`serve --workers 0 at ${broker.url}, worker pid ${broker.worker.pid}`);
  await run(MODERN);
  await group("2026-07-28 headers", async () => headerSummary());
  await run(LEGACY);
} catch (e) {
  notOk("the run could not go on", e?.stack ?? String(e));
} finally {
  clearTimeout(timer);
  broker.cleanup();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
