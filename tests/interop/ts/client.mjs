#!/usr/bin/env node
// Interoperability test client for taskbroker, written against the official
// TypeScript MCP SDK (@modelcontextprotocol/sdk, version pinned in
// package.json). It talks to a running server over Streamable HTTP and checks
// MCP 2025-11-25 tasks as the SDK sees them.
//
//   npm ci --prefix tests/interop/ts
//   node tests/interop/ts/client.mjs http://127.0.0.1:PORT/mcp
//
// The URL may also come from TASKBROKER_URL. The server is expected to run
// with its default --poll-interval and --default-ttl; if not, set
// TASKBROKER_EXPECT_POLL_INTERVAL_MS / TASKBROKER_EXPECT_DEFAULT_TTL_MS.
//
// One line per check (`ok - ...` / `not ok - ...`), then `N passed, M failed`.
// Exit status 0 only when every check passed.

import assert from 'node:assert/strict';
import { setTimeout as delay } from 'node:timers/promises';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
    CallToolResultSchema,
    CreateTaskResultSchema,
    ErrorCode,
    LATEST_PROTOCOL_VERSION,
    McpError,
    RELATED_TASK_META_KEY
} from '@modelcontextprotocol/sdk/types.js';

// ---------------------------------------------------------------------------
// Configuration

const URL_ARG = process.argv[2] ?? process.env.TASKBROKER_URL;
if (!URL_ARG) {
    console.error('usage: node client.mjs http://127.0.0.1:PORT/mcp   (or set TASKBROKER_URL)');
    process.exit(2);
}
let SERVER_URL;
try {
    SERVER_URL = new URL(URL_ARG);
} catch {
    console.error(`not a URL: ${URL_ARG}`);
    process.exit(2);
}

const EXPECT_POLL_INTERVAL = Number(process.env.TASKBROKER_EXPECT_POLL_INTERVAL_MS ?? 1000);
const EXPECT_DEFAULT_TTL = Number(process.env.TASKBROKER_EXPECT_DEFAULT_TTL_MS ?? 3_600_000);
const TTL = 600_000; // requested ttl (ms): well under the default --max-ttl, so never clamped
const CHECK_TIMEOUT_MS = 90_000; // no single check may take longer than this

const STATUSES = ['working', 'input_required', 'completed', 'failed', 'cancelled'];
const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const ISO_8601 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

// ---------------------------------------------------------------------------
// Helpers

const j = v => JSON.stringify(v);

/** Connects a fresh SDK client (one MCP session). */
async function connect(name) {
    const client = new Client({ name, version: '1.0.0' });
    const transport = new StreamableHTTPClientTransport(SERVER_URL);
    const errors = [];
    const notifications = [];
    let closing = false;
    client.onerror = err => {
        // Closing the client aborts the standalone GET SSE stream; the SDK reports
        // that abort through onerror. Anything else is a real protocol error.
        if (closing) return;
        errors.push(err);
    };
    client.fallbackNotificationHandler = async n => {
        notifications.push(n);
    };
    await client.connect(transport);
    return {
        client,
        transport,
        tasks: client.experimental.tasks,
        errors,
        notifications,
        async close() {
            closing = true;
            await client.close();
        }
    };
}

/** Awaits `promise`, which must reject with an McpError of `code`; returns the error. */
async function expectMcpError(promise, code, what) {
    let value;
    try {
        value = await promise;
    } catch (err) {
        assert.ok(err instanceof McpError, `${what}: expected McpError ${code}, got ${err?.constructor?.name}: ${err?.message}`);
        assert.equal(err.code, code, `${what}: expected error code ${code}, got ${err.code} (${err.message})`);
        return err;
    }
    assert.fail(`${what}: expected McpError ${code}, but it succeeded with ${j(value)}`);
}

/** The text of a CallToolResult whose content is exactly one text block. */
function onlyText(result, what) {
    assert.ok(Array.isArray(result.content), `${what}: content is not an array: ${j(result)}`);
    assert.equal(result.content.length, 1, `${what}: expected exactly one content block: ${j(result)}`);
    assert.equal(result.content[0].type, 'text', `${what}: content[0] is not text: ${j(result)}`);
    assert.equal(typeof result.content[0].text, 'string', `${what}: content[0].text is not a string`);
    return result.content[0].text;
}

function assertTimestamp(value, field, what) {
    assert.equal(typeof value, 'string', `${what}: ${field} missing or not a string (${j(value)})`);
    assert.match(value, ISO_8601, `${what}: ${field} is not ISO 8601: ${value}`);
    const ms = Date.parse(value);
    assert.ok(!Number.isNaN(ms), `${what}: ${field} does not parse: ${value}`);
    // Same machine (loopback): the server clock may not be far from ours.
    assert.ok(Math.abs(ms - Date.now()) < 300_000, `${what}: ${field} ${value} is more than 5 min from local time`);
    return ms;
}

/**
 * Asserts the shape of a Task as returned by tasks/get, tasks/cancel, tasks/list
 * and CreateTaskResult.task. `expect` pins fields known in advance.
 */
function assertTask(task, what, expect = {}) {
    assert.ok(task && typeof task === 'object', `${what}: not a task object: ${j(task)}`);
    assert.equal(typeof task.taskId, 'string', `${what}: taskId not a string: ${j(task)}`);
    assert.match(task.taskId, UUID_V4, `${what}: taskId is not a UUIDv4: ${task.taskId}`);
    assert.ok(STATUSES.includes(task.status), `${what}: invalid status ${j(task.status)}`);
    const created = assertTimestamp(task.createdAt, 'createdAt', what);
    const updated = assertTimestamp(task.lastUpdatedAt, 'lastUpdatedAt', what);
    assert.ok(updated >= created, `${what}: lastUpdatedAt ${task.lastUpdatedAt} < createdAt ${task.createdAt}`);
    assert.ok('ttl' in task, `${what}: ttl missing: ${j(task)}`);
    assert.ok(task.ttl === null || (Number.isInteger(task.ttl) && task.ttl > 0), `${what}: ttl invalid: ${j(task.ttl)}`);
    assert.equal(task.pollInterval, EXPECT_POLL_INTERVAL, `${what}: pollInterval ${j(task.pollInterval)} != ${EXPECT_POLL_INTERVAL}`);
    if (task.statusMessage !== undefined) {
        assert.equal(typeof task.statusMessage, 'string', `${what}: statusMessage not a string`);
    }
    for (const [k, v] of Object.entries(expect)) {
        assert.deepEqual(task[k], v, `${what}: ${k} is ${j(task[k])}, expected ${j(v)} (task ${j(task)})`);
    }
    return task;
}

/** tasks/get, tasks/list, tasks/cancel results SHOULD NOT carry related-task metadata (spec, "Associating Task-Related Messages"). */
function assertNoRelatedTaskMeta(result, what) {
    assert.equal(result?._meta?.[RELATED_TASK_META_KEY], undefined, `${what}: result carries ${RELATED_TASK_META_KEY} _meta: ${j(result._meta)}`);
}

/** tasks/result responses MUST carry related-task metadata naming the task. */
function assertRelatedTaskMeta(result, taskId, what) {
    assert.ok(result._meta, `${what}: no _meta on tasks/result response (SDK passes _meta through ResultSchema): ${j(result)}`);
    assert.deepEqual(result._meta[RELATED_TASK_META_KEY], { taskId }, `${what}: _meta[${RELATED_TASK_META_KEY}] = ${j(result._meta[RELATED_TASK_META_KEY])}, expected ${j({ taskId })}`);
}

/** Creates a task with tools/call + params.task through the SDK's request(). */
async function createToolTask(client, name, args, task = { ttl: TTL }) {
    const t0 = Date.now();
    const created = await client.request({ method: 'tools/call', params: { name, arguments: args } }, CreateTaskResultSchema, { task });
    const elapsed = Date.now() - t0;
    assert.ok(created.task, `tools/call ${name} with task: no task in ${j(created)}`);
    return { created, elapsed };
}

/**
 * Polls tasks/get, sleeping pollInterval between polls, until the task is terminal.
 * Returns every Task seen (last one terminal).
 */
async function pollUntilTerminal(tasks, taskId, what, deadlineMs = 60_000) {
    const seen = [];
    const start = Date.now();
    for (;;) {
        const task = await tasks.getTask(taskId);
        assertNoRelatedTaskMeta(task, `${what} tasks/get`);
        assertTask(task, `${what} tasks/get`, { taskId });
        if (seen.length) {
            const prev = seen[seen.length - 1];
            assert.equal(task.createdAt, prev.createdAt, `${what}: createdAt changed between polls`);
            assert.equal(task.ttl, prev.ttl, `${what}: ttl changed between polls`);
            assert.ok(Date.parse(task.lastUpdatedAt) >= Date.parse(prev.lastUpdatedAt), `${what}: lastUpdatedAt went back`);
            assert.ok(!TERMINAL.has(prev.status), `${what}: polled past a terminal status`);
        }
        seen.push(task);
        if (TERMINAL.has(task.status)) return seen;
        assert.equal(task.status, 'working', `${what}: unexpected non-terminal status ${task.status}`);
        assert.ok(Date.now() - start < deadlineMs, `${what}: still ${task.status} after ${deadlineMs} ms`);
        await delay(task.pollInterval); // honour the server's suggested interval
    }
}

/** Collects every message a callToolStream yields, with the time it arrived. */
async function collectStream(gen) {
    const out = [];
    for await (const message of gen) out.push({ at: Date.now(), message });
    return out;
}

function describeStream(items) {
    return j(
        items.map(({ message: m }) =>
            m.type === 'taskCreated' || m.type === 'taskStatus'
                ? `${m.type}:${m.task.status}`
                : m.type === 'error'
                  ? `error:${m.error?.code}`
                  : m.type
        )
    );
}

// ---------------------------------------------------------------------------
// Runner

let passed = 0;
let failed = 0;

async function check(name, fn) {
    let timer;
    try {
        const detail = await Promise.race([
            fn(),
            new Promise((_, reject) => {
                timer = setTimeout(() => reject(new Error(`check timed out after ${CHECK_TIMEOUT_MS} ms`)), CHECK_TIMEOUT_MS);
            })
        ]);
        passed++;
        console.log(`ok - ${name}${detail ? ` (${detail})` : ''}`);
    } catch (err) {
        failed++;
        console.log(`not ok - ${name}`);
        const text = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
        for (const line of text.split('\n')) console.log(`  # ${line}`);
        if (err instanceof McpError) console.log(`  # McpError code=${err.code} data=${j(err.data)}`);
        if (err?.stack && !(err instanceof assert.AssertionError)) {
            for (const line of err.stack.split('\n').slice(1, 6)) console.log(`  # ${line.trim()}`);
        }
    } finally {
        clearTimeout(timer);
    }
}

// ---------------------------------------------------------------------------
// Checks

console.log(`# taskbroker interop (TypeScript SDK ${await sdkVersion()}) against ${SERVER_URL.href}`);

let main; // the main session, shared by the checks below
await check('initialize: session, protocol version, server capabilities', async () => {
    main = await connect('taskbroker-interop-ts');
    const { client, transport } = main;
    assert.equal(typeof transport.sessionId, 'string', 'no Mcp-Session-Id from initialize');
    assert.match(transport.sessionId, /^[0-9A-Za-z._-]{16,}$/, `session id looks wrong: ${transport.sessionId}`);
    assert.equal(transport.protocolVersion, LATEST_PROTOCOL_VERSION, `negotiated ${transport.protocolVersion}`);
    const caps = client.getServerCapabilities();
    assert.ok(caps?.tools, `no tools capability: ${j(caps)}`);
    assert.deepEqual(caps.tasks?.list, {}, `tasks.list: ${j(caps.tasks)}`);
    assert.deepEqual(caps.tasks?.cancel, {}, `tasks.cancel: ${j(caps.tasks)}`);
    assert.deepEqual(caps.tasks?.requests?.tools?.call, {}, `tasks.requests.tools.call: ${j(caps.tasks)}`);
    const info = client.getServerVersion();
    assert.equal(info?.name, 'taskbroker', `serverInfo: ${j(info)}`);
    assert.equal(typeof info.version, 'string');
    return `protocol ${transport.protocolVersion}, server ${info.name} ${info.version}`;
});
if (!main) {
    console.log(`${passed} passed, ${failed} failed`);
    process.exit(1);
}
const { client, tasks } = main;

await check('tools/list: demo tools with their execution.taskSupport', async () => {
    const { tools, nextCursor } = await client.listTools(); // also fills the SDK's taskSupport cache
    assert.equal(nextCursor, undefined);
    const support = Object.fromEntries(tools.map(t => [t.name, t.execution?.taskSupport]));
    assert.deepEqual(support, { approve: 'optional', echo: 'forbidden', fail: 'optional', sleep: 'optional', sleep_as_task: 'required' });
    for (const t of tools) assert.equal(t.inputSchema?.type, 'object', `${t.name}: inputSchema ${j(t.inputSchema)}`);
    const sleep = tools.find(t => t.name === 'sleep');
    assert.deepEqual(sleep.inputSchema.required, ['seconds']);
    assert.equal(sleep.inputSchema.properties.seconds.type, 'number');
    assert.equal(client.isToolTask('sleep'), true, 'SDK: sleep not cached as a task tool');
    assert.equal(client.isToolTaskRequired('sleep_as_task'), true, 'SDK: sleep_as_task not cached as task-required');
    assert.equal(client.isToolTask('echo'), false);
    return Object.keys(support).join(', ');
});

let sleepTaskId;
let issuedCursor; // a nextCursor the server gave the main session, if its page size made one
await check('sleep as a task (ttl): CreateTaskResult, polling tasks/get at pollInterval, tasks/result with related-task _meta', async () => {
    const { created, elapsed } = await createToolTask(client, 'sleep', { seconds: 2, message: 'interop: slept' });
    assert.ok(elapsed < 2000, `CreateTaskResult took ${elapsed} ms: it must come back before the tool finishes`);
    const task = assertTask(created.task, 'CreateTaskResult.task', { status: 'working', ttl: TTL });
    assert.equal(created.task.statusMessage, undefined, `unexpected statusMessage on creation: ${created.task.statusMessage}`);
    sleepTaskId = task.taskId;

    const seen = await pollUntilTerminal(tasks, task.taskId, 'sleep task');
    const last = seen[seen.length - 1];
    assert.equal(last.status, 'completed', `ended ${last.status}: ${j(last)}`);
    assert.equal(last.createdAt, task.createdAt, 'createdAt differs from CreateTaskResult');
    assert.equal(last.ttl, TTL);
    assert.ok(seen.length >= 2, `only ${seen.length} poll(s) for a 2 s task: ${j(seen.map(t => t.status))}`);
    assert.ok(seen.slice(0, -1).every(t => t.status === 'working'), `statuses ${j(seen.map(t => t.status))}`);
    const took = Date.parse(last.lastUpdatedAt) - Date.parse(last.createdAt);
    assert.ok(took >= 1900, `completed ${took} ms after creation for a 2 s sleep`);

    const result = await tasks.getTaskResult(task.taskId, CallToolResultSchema);
    assert.equal(onlyText(result, 'tasks/result'), 'interop: slept');
    assert.notEqual(result.isError, true, `isError set: ${j(result)}`);
    assertRelatedTaskMeta(result, task.taskId, 'tasks/result');
    // Again: a terminal task answers tasks/result any number of times, the same.
    const again = await tasks.getTaskResult(task.taskId, CallToolResultSchema);
    assert.deepEqual(again, result, 'second tasks/result differs');
    return `${seen.length} polls: ${seen.map(t => t.status).join(' -> ')}`;
});

await check('tasks/list: pages through with nextCursor, holds every created task with valid fields, newest first', async () => {
    const ids = [];
    for (let i = 0; i < 3; i++) {
        const { created } = await createToolTask(client, 'sleep', { seconds: 0, message: `list ${i}` });
        assertTask(created.task, `list task ${i}`, { status: 'working', ttl: TTL });
        ids.push(created.task.taskId);
    }
    for (const id of ids) {
        const r = await tasks.getTaskResult(id, CallToolResultSchema); // wait until each is done
        assertRelatedTaskMeta(r, id, 'tasks/result');
    }

    const all = [];
    const cursors = new Set();
    let cursor;
    let pages = 0;
    do {
        const page = await tasks.listTasks(cursor);
        pages++;
        assertNoRelatedTaskMeta(page, `tasks/list page ${pages}`);
        assert.ok(Array.isArray(page.tasks), `page ${pages}: tasks not an array`);
        for (const t of page.tasks) assertTask(t, `tasks/list page ${pages} entry ${t.taskId}`);
        all.push(...page.tasks);
        cursor = page.nextCursor;
        if (cursor !== undefined) {
            assert.equal(typeof cursor, 'string', `nextCursor not a string: ${j(cursor)}`);
            assert.ok(cursor.length > 0, 'empty nextCursor');
            assert.ok(page.tasks.length > 0, `page ${pages} is empty but has a nextCursor`);
            assert.ok(!cursors.has(cursor), `nextCursor repeated: ${cursor}`);
            cursors.add(cursor);
            issuedCursor ??= cursor;
        }
        assert.ok(pages <= 1000, 'more than 1000 pages');
    } while (cursor !== undefined);

    const listed = all.map(t => t.taskId);
    assert.equal(new Set(listed).size, listed.length, `duplicate task ids across pages: ${j(listed)}`);
    for (const id of [sleepTaskId, ...ids].filter(Boolean)) {
        assert.ok(listed.includes(id), `task ${id} missing from tasks/list (${listed.length} listed)`);
    }
    for (const id of ids) {
        const t = all.find(x => x.taskId === id);
        assert.equal(t.status, 'completed', `listed ${id} as ${t.status}`);
        assert.equal(t.ttl, TTL);
    }
    // Newest first (README: keyset pages on the row key, newest first).
    const order = ids.map(id => listed.indexOf(id));
    assert.ok(order[0] > order[1] && order[1] > order[2], `created order ${j(ids)} listed at positions ${j(order)}: not newest first`);
    for (let i = 1; i < all.length; i++) {
        assert.ok(Date.parse(all[i - 1].createdAt) >= Date.parse(all[i].createdAt), `tasks/list not newest first at ${i}: ${all[i - 1].createdAt} < ${all[i].createdAt}`);
    }
    return `${all.length} tasks in ${pages} page(s)`;
});

await check('tasks/list with a cursor the server never issued fails with -32602', async () => {
    await expectMcpError(tasks.listTasks('not-a-cursor'), ErrorCode.InvalidParams, 'tasks/list bad cursor');
});

await check('tasks/cancel of a 60 s sleep: cancelled, stays cancelled, tasks/result -32800, second cancel -32602', async () => {
    const { created } = await createToolTask(client, 'sleep', { seconds: 60 });
    const id = created.task.taskId;
    assertTask(created.task, 'CreateTaskResult.task', { status: 'working', ttl: TTL });
    await delay(300); // let a worker pick it up, so the cancel reaches a running tool

    const cancelled = await tasks.cancelTask(id);
    assertNoRelatedTaskMeta(cancelled, 'tasks/cancel');
    assertTask(cancelled, 'tasks/cancel result', { taskId: id, status: 'cancelled', ttl: TTL, createdAt: created.task.createdAt });

    await delay(1500); // past the tool's next progress tick: the worker must not overwrite the status
    const after = await tasks.getTask(id);
    assertNoRelatedTaskMeta(after, 'tasks/get');
    assertTask(after, 'tasks/get after cancel', { taskId: id, status: 'cancelled', ttl: TTL, lastUpdatedAt: cancelled.lastUpdatedAt });

    const page = await tasks.listTasks();
    const listed = page.tasks.find(t => t.taskId === id);
    assert.ok(listed, 'cancelled task missing from first tasks/list page');
    assert.equal(listed.status, 'cancelled');

    const err = await expectMcpError(tasks.getTaskResult(id, CallToolResultSchema), -32800, 'tasks/result of a cancelled task');
    assert.deepEqual(err.data, { taskId: id, status: 'cancelled' }, `error data ${j(err.data)}`);
    assert.match(err.message, /cancelled/, err.message);

    await expectMcpError(tasks.cancelTask(id), ErrorCode.InvalidParams, 'tasks/cancel of a terminal (cancelled) task');
    await expectMcpError(tasks.cancelTask(sleepTaskId ?? id), ErrorCode.InvalidParams, 'tasks/cancel of a terminal (completed) task');
    return `statusMessage ${j(cancelled.statusMessage)}, result error ${err.code}`;
});

await check('sleep_as_task as a task: tasks/result blocks until done, then tasks/get says completed', async () => {
    const { created } = await createToolTask(client, 'sleep_as_task', { seconds: 1 });
    const id = created.task.taskId;
    assertTask(created.task, 'CreateTaskResult.task', { status: 'working', ttl: TTL });
    const t0 = Date.now();
    const result = await tasks.getTaskResult(id, CallToolResultSchema); // blocks while working
    const waited = Date.now() - t0;
    assert.equal(onlyText(result, 'tasks/result'), 'slept 1 s');
    assert.notEqual(result.isError, true);
    assertRelatedTaskMeta(result, id, 'tasks/result');
    assert.ok(waited >= 500, `tasks/result answered after ${waited} ms; it must block until the 1 s task is terminal`);
    const task = await tasks.getTask(id);
    assertTask(task, 'tasks/get', { taskId: id, status: 'completed', ttl: TTL });
    return `tasks/result blocked ${waited} ms`;
});

await check('callToolStream(sleep_as_task) without options: SDK adds params.task itself; server default ttl', async () => {
    const items = await collectStream(tasks.callToolStream({ name: 'sleep_as_task', arguments: { seconds: 0 } }, CallToolResultSchema));
    const msgs = items.map(i => i.message);
    assert.equal(msgs[0]?.type, 'taskCreated', `stream ${describeStream(items)}`);
    assertTask(msgs[0].task, 'taskCreated.task', { status: 'working', ttl: EXPECT_DEFAULT_TTL });
    const last = msgs[msgs.length - 1];
    assert.equal(last.type, 'result', `stream ${describeStream(items)}: ${j(last)}`);
    assert.equal(onlyText(last.result, 'stream result'), 'slept 0 s');
    assertRelatedTaskMeta(last.result, msgs[0].task.taskId, 'stream result');
    return describeStream(items);
});

await check('callToolStream(sleep, task ttl): taskCreated, taskStatus working..., taskStatus completed, result', async () => {
    const items = await collectStream(
        tasks.callToolStream({ name: 'sleep', arguments: { seconds: 2, message: 'streamed' } }, CallToolResultSchema, { task: { ttl: TTL } })
    );
    const msgs = items.map(i => i.message);
    const shape = describeStream(items);
    assert.ok(msgs.length >= 4, `too few messages: ${shape}`);
    assert.equal(msgs[0].type, 'taskCreated', shape);
    const created = assertTask(msgs[0].task, 'taskCreated.task', { status: 'working', ttl: TTL });
    const statuses = msgs.slice(1, -1);
    assert.ok(statuses.every(m => m.type === 'taskStatus'), shape);
    statuses.forEach((m, i) => assertTask(m.task, `taskStatus #${i}`, { taskId: created.taskId, createdAt: created.createdAt, ttl: TTL }));
    assert.ok(statuses.slice(0, -1).every(m => m.task.status === 'working'), shape);
    assert.equal(statuses[statuses.length - 1].task.status, 'completed', shape);
    assert.ok(statuses.length >= 2, `a 2 s task completed on the first poll: ${shape}`);
    // The SDK waits pollInterval between tasks/get calls.
    for (let i = 2; i < items.length - 1; i++) {
        const gap = items[i].at - items[i - 1].at;
        assert.ok(gap >= EXPECT_POLL_INTERVAL - 50, `SDK polled after ${gap} ms < pollInterval`);
    }
    const last = msgs[msgs.length - 1];
    assert.equal(last.type, 'result', shape);
    assert.equal(onlyText(last.result, 'stream result'), 'streamed');
    assert.notEqual(last.result.isError, true);
    assertRelatedTaskMeta(last.result, created.taskId, 'stream result');
    return shape;
});

await check('callToolStream(fail, task): ends failed; SDK yields error -32603 (no tasks/result); tasks/result holds isError result', async () => {
    const items = await collectStream(
        tasks.callToolStream({ name: 'fail', arguments: { message: 'interop boom' } }, CallToolResultSchema, { task: { ttl: TTL } })
    );
    const msgs = items.map(i => i.message);
    const shape = describeStream(items);
    assert.equal(msgs[0]?.type, 'taskCreated', shape);
    const created = assertTask(msgs[0].task, 'taskCreated.task', { status: 'working', ttl: TTL });
    const statuses = msgs.slice(1, -1);
    assert.ok(statuses.length >= 1 && statuses.every(m => m.type === 'taskStatus'), shape);
    const final = statuses[statuses.length - 1].task;
    assertTask(final, 'final taskStatus', { taskId: created.taskId, status: 'failed' });
    assert.equal(typeof final.statusMessage, 'string', `failed task has no statusMessage: ${j(final)}`);
    assert.match(final.statusMessage, /interop boom/, `statusMessage ${j(final.statusMessage)}`);
    // SDK (shared/protocol.js requestStream): a `failed` task yields a synthetic
    // McpError(InternalError, "Task <id> failed") and does not call tasks/result.
    const last = msgs[msgs.length - 1];
    assert.equal(last.type, 'error', `${shape}: ${j(last)}`);
    assert.ok(last.error instanceof McpError);
    assert.equal(last.error.code, ErrorCode.InternalError);
    assert.equal(last.error.message, `MCP error -32603: Task ${created.taskId} failed`);
    // The spec's tasks/result of a failed task: exactly what the call returned.
    const result = await tasks.getTaskResult(created.taskId, CallToolResultSchema);
    assert.equal(result.isError, true, `tasks/result of failed task: ${j(result)}`);
    assert.equal(onlyText(result, 'tasks/result'), 'interop boom');
    assertRelatedTaskMeta(result, created.taskId, 'tasks/result of failed task');
    return `${shape}; statusMessage ${j(final.statusMessage)}`;
});

await check('callToolStream(sleep 60 s) cancelled mid-stream: taskStatus cancelled, SDK yields error -32603 "was cancelled"', async () => {
    const items = [];
    let cancelled;
    for await (const message of tasks.callToolStream({ name: 'sleep', arguments: { seconds: 60 } }, CallToolResultSchema, { task: { ttl: TTL } })) {
        items.push({ at: Date.now(), message });
        if (message.type === 'taskCreated') {
            cancelled = await tasks.cancelTask(message.task.taskId);
            assertTask(cancelled, 'tasks/cancel result', { taskId: message.task.taskId, status: 'cancelled' });
        }
        assert.ok(items.length < 10, `stream goes on: ${describeStream(items)}`);
    }
    const msgs = items.map(i => i.message);
    const shape = describeStream(items);
    assert.equal(shape, j(['taskCreated:working', 'taskStatus:cancelled', 'error:-32603']));
    assert.equal(msgs[1].task.lastUpdatedAt, cancelled.lastUpdatedAt);
    // SDK (shared/protocol.js requestStream): a cancelled task yields a synthetic McpError(InternalError).
    assert.equal(msgs[2].error.message, `MCP error -32603: Task ${cancelled.taskId} was cancelled`);
    return shape;
});

await check('task-augmented sleep with onprogress: any progress received is well-formed (progress is optional for tasks)', async () => {
    const progress = [];
    const created = await client.request({ method: 'tools/call', params: { name: 'sleep', arguments: { seconds: 2 } } }, CreateTaskResultSchema, {
        task: { ttl: TTL },
        onprogress: p => progress.push(p)
    });
    assertTask(created.task, 'CreateTaskResult.task', { status: 'working', ttl: TTL });
    const result = await tasks.getTaskResult(created.task.taskId, CallToolResultSchema);
    assert.equal(onlyText(result, 'tasks/result'), 'slept 2 s');
    assertRelatedTaskMeta(result, created.task.taskId, 'tasks/result');
    await delay(200); // a late notification would still arrive
    for (let i = 0; i < progress.length; i++) {
        assert.equal(typeof progress[i].progress, 'number', j(progress[i]));
        if (i > 0) assert.ok(progress[i].progress > progress[i - 1].progress, `progress not increasing: ${j(progress)}`);
    }
    assert.deepEqual(main.errors.map(e => e.message), [], 'client.onerror (e.g. progress for an unknown token)');
    return `${progress.length} progress notification(s) for the task`;
});

await check('callToolStream(echo): taskSupport forbidden, so no task: a single result', async () => {
    const args = { via: 'stream' };
    const items = await collectStream(tasks.callToolStream({ name: 'echo', arguments: args }, CallToolResultSchema));
    assert.equal(describeStream(items), j(['result']));
    assert.deepEqual(items[0].message.result.structuredContent, args);
});

await check('echo with params.task is refused with -32601 (taskSupport forbidden)', async () => {
    await expectMcpError(createToolTask(client, 'echo', { a: 1 }), ErrorCode.MethodNotFound, 'task-augmented echo');
});

await check('plain callTool(sleep) returns the text; onprogress sees increasing progress', async () => {
    const progress = [];
    const t0 = Date.now();
    const result = await client.callTool({ name: 'sleep', arguments: { seconds: 3 } }, CallToolResultSchema, {
        onprogress: p => progress.push(p)
    });
    const took = Date.now() - t0;
    assert.equal(onlyText(result, 'plain sleep'), 'slept 3 s');
    assert.notEqual(result.isError, true);
    assert.equal(result._meta?.[RELATED_TASK_META_KEY], undefined, 'plain call result has related-task _meta');
    assert.ok(took >= 2900, `plain 3 s sleep answered after ${took} ms`);
    assert.ok(progress.length >= 2, `only ${progress.length} progress notification(s): ${j(progress)}`);
    for (let i = 0; i < progress.length; i++) {
        const p = progress[i];
        assert.equal(typeof p.progress, 'number', `progress ${j(p)}`);
        if (i > 0) assert.ok(p.progress > progress[i - 1].progress, `progress not increasing: ${j(progress)}`);
        if (p.total !== undefined) {
            assert.equal(p.total, 3, `total ${j(p)}`);
            assert.ok(p.progress <= p.total, `progress beyond total: ${j(p)}`);
        }
        if (p.message !== undefined) assert.equal(typeof p.message, 'string');
    }
    assert.equal(progress[progress.length - 1].progress, 3, `last progress ${j(progress[progress.length - 1])}`);
    return `${progress.length} progress: ${progress.map(p => `${p.progress}/${p.total}`).join(' ')}`;
});

await check('plain callTool(fail): isError result, no exception', async () => {
    const result = await client.callTool({ name: 'fail', arguments: { message: 'plain boom' } });
    assert.equal(result.isError, true, j(result));
    assert.equal(onlyText(result, 'plain fail'), 'plain boom');
});

await check('plain callTool(sleep_as_task): the SDK refuses it client-side (-32600) once tools/list is cached', async () => {
    // SDK client/index.js Client.callTool: isToolTaskRequired(name) -> throws
    // McpError(InvalidRequest, 'Tool "..." requires task-based execution. ...') without sending.
    const err = await expectMcpError(client.callTool({ name: 'sleep_as_task', arguments: { seconds: 0 } }), ErrorCode.InvalidRequest, 'callTool(sleep_as_task)');
    assert.match(err.message, /requires task-based execution/, err.message);
});

await check('plain tools/call of sleep_as_task reaching the server: -32601 (spec: taskSupport required)', async () => {
    // A fresh session that never listed tools: the SDK has no taskSupport cache and sends the call.
    const other = await connect('taskbroker-interop-ts-nolist');
    try {
        const err = await expectMcpError(
            other.client.callTool({ name: 'sleep_as_task', arguments: { seconds: 0 } }),
            ErrorCode.MethodNotFound,
            'server-side plain call of sleep_as_task'
        );
        assert.match(err.message, /sleep_as_task/, err.message);
        assert.deepEqual(other.errors, [], `client.onerror: ${other.errors.map(e => e.message).join('; ')}`);
        return err.message;
    } finally {
        await other.close();
    }
});

await check('tasks/get, tasks/result, tasks/cancel of an unknown task id fail with -32602 "Task not found"', async () => {
    const unknown = '00000000-0000-4000-8000-000000000000';
    const e1 = await expectMcpError(tasks.getTask(unknown), ErrorCode.InvalidParams, 'tasks/get unknown');
    assert.equal(e1.message, 'MCP error -32602: Failed to retrieve task: Task not found');
    const e2 = await expectMcpError(tasks.getTaskResult(unknown, CallToolResultSchema), ErrorCode.InvalidParams, 'tasks/result unknown');
    assert.match(e2.message, /Task not found/);
    const e3 = await expectMcpError(tasks.cancelTask(unknown), ErrorCode.InvalidParams, 'tasks/cancel unknown');
    assert.match(e3.message, /Task not found/);
    await expectMcpError(tasks.getTask('not-a-uuid'), ErrorCode.InvalidParams, 'tasks/get malformed id');
});

await check('tasks belong to their session: another session gets -32602 and does not list them', async () => {
    assert.ok(sleepTaskId, 'no task from the first check');
    const other = await connect('taskbroker-interop-ts-other');
    try {
        assert.notEqual(other.transport.sessionId, main.transport.sessionId);
        const e = await expectMcpError(other.tasks.getTask(sleepTaskId), ErrorCode.InvalidParams, "tasks/get of another session's task");
        assert.equal(e.message, 'MCP error -32602: Failed to retrieve task: Task not found');
        await expectMcpError(other.tasks.getTaskResult(sleepTaskId, CallToolResultSchema), ErrorCode.InvalidParams, "tasks/result of another session's task");
        await expectMcpError(other.tasks.cancelTask(sleepTaskId), ErrorCode.InvalidParams, "tasks/cancel of another session's task");
        const page = await other.tasks.listTasks();
        assert.deepEqual(page.tasks, [], `new session lists ${page.tasks.length} task(s)`);
        assert.equal(page.nextCursor, undefined);
        if (issuedCursor !== undefined) {
            // README: cursors are bound to their session.
            await expectMcpError(other.tasks.listTasks(issuedCursor), ErrorCode.InvalidParams, "tasks/list with another session's cursor");
        }
        // Our own task is untouched.
        assertTask(await tasks.getTask(sleepTaskId), 'own task after foreign cancel', { status: 'completed' });
        return issuedCursor === undefined ? 'no cursor was issued (one page), foreign-cursor case not exercised' : "another session's cursor refused too";
    } finally {
        await other.close();
    }
});

await check('echo plain call returns structuredContent equal to the arguments, and the same JSON as text', async () => {
    const args = { text: 'héllo ✓', n: 42, f: -1.5, ok: true, none: null, list: [1, 'two', { three: 3 }], nested: { a: { b: [] } } };
    const result = await client.callTool({ name: 'echo', arguments: args });
    assert.deepEqual(result.structuredContent, args);
    assert.deepEqual(JSON.parse(onlyText(result, 'echo')), args);
    assert.notEqual(result.isError, true);
});

await check('no protocol errors or unexpected notifications reported by the SDK on the main session', async () => {
    assert.deepEqual(main.errors.map(e => e.message), [], 'client.onerror');
    // The only notifications the SDK leaves to the fallback handler are
    // notifications/tasks/status (optional in the spec, sent by the broker on the
    // GET stream): each carries a full, valid Task and no related-task _meta.
    const statuses = new Set(['working', 'input_required', 'completed', 'failed', 'cancelled']);
    for (const n of main.notifications) {
        assert.equal(n.method, 'notifications/tasks/status', `unexpected notification ${JSON.stringify(n)}`);
        assert.equal(typeof n.params.taskId, 'string');
        assert.ok(statuses.has(n.params.status), `status ${n.params.status}`);
        assert.ok(!Number.isNaN(Date.parse(n.params.createdAt)) && !Number.isNaN(Date.parse(n.params.lastUpdatedAt)));
        assert.ok('ttl' in n.params, 'ttl key present');
        assert.equal(n.params._meta, undefined, 'no related-task _meta on status notifications (T-30)');
    }
});

await check('session termination (HTTP DELETE) succeeds', async () => {
    await main.transport.terminateSession();
    assert.equal(main.transport.sessionId, undefined);
    await main.close();
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);

async function sdkVersion() {
    try {
        const { readFileSync } = await import('node:fs');
        const pkg = new URL('./node_modules/@modelcontextprotocol/sdk/package.json', import.meta.url);
        return JSON.parse(readFileSync(pkg, 'utf8')).version;
    } catch {
        return 'unknown';
    }
}
