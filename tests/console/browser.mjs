// The web console in a real browser: headless Chromium driven with
// playwright-core against a running taskbroker that tests/console.rs
// started and seeded. Prints one line per check ("ok - ..." or
// "not ok - ...") and stops at the first failure, exiting 1.
//
// Environment:
//   TB_URL             base URL of the broker, e.g. http://127.0.0.1:PORT
//   TB_OPERATOR_TOKEN  an operator token (may open the console)
//   TB_USER_TOKEN      a valid non-operator token (principal alice)
//   TB_SHOTS           folder for the screenshots (created)
//   TB_SEEDED_TOOL     a tool that already ran tasks, e.g. echo
//   TB_FAILED_TASK     the id of a failed task that was seeded
//   TB_LONG_OWNER_TOKEN a valid non-operator token of a long principal name
//   TB_UPSTREAM        the name of a ready upstream server of the broker's
//                      config, if it has one (its row on the overview)
//   CHROMIUM           the browser binary [default: /usr/bin/chromium]
//
// Run: npm ci && node browser.mjs (in this folder).

import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

// ---------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------

function required(name) {
  const value = process.env[name];
  if (!value) {
    console.log(`not ok - environment variable ${name} is not set`);
    process.exit(1);
  }
  return value;
}

const BASE = required('TB_URL').replace(/\/+$/, '');
const OPERATOR_TOKEN = required('TB_OPERATOR_TOKEN');
const USER_TOKEN = required('TB_USER_TOKEN');
const SHOTS = required('TB_SHOTS');
const SEEDED_TOOL = required('TB_SEEDED_TOOL');
const FAILED_TASK = required('TB_FAILED_TASK');
const LONG_OWNER_TOKEN = required('TB_LONG_OWNER_TOKEN');
const UPSTREAM = process.env.TB_UPSTREAM || '';
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';

/** Default wait for any element, navigation or condition. */
const TIMEOUT = 10_000;
/** The whole run may not take longer than this. */
const RUN_LIMIT = 180_000;

// ---------------------------------------------------------------------
// MCP 2026-07-28 (stateless): what the test sends to /mcp as alice.
// Kept together so a change of the protocol is fixed in one place.
// ---------------------------------------------------------------------

const MCP_PATH = '/mcp';
const MCP_VERSION = '2026-07-28';
/** `params._meta` of every request: version, capabilities, client. */
const MCP_ENVELOPE = {
  'io.modelcontextprotocol/protocolVersion': MCP_VERSION,
  'io.modelcontextprotocol/clientCapabilities': {
    extensions: { 'io.modelcontextprotocol/tasks': {} },
    elicitation: { form: {} },
  },
  'io.modelcontextprotocol/clientInfo': { name: 'console-test', version: '1' },
};
/** Arguments of the demo tool `approve` (one elicitation, form mode). */
const APPROVE_ARGUMENTS = { question: 'Ship it?' };
/** The elicitation answer that approves. */
const APPROVE_ANSWER = { action: 'accept', content: { approved: true } };
/** Arguments of the demo tool `sleep`: long enough to be cancelled. */
const SLEEP_ARGUMENTS = { seconds: 600 };
/** Arguments `sleep` refuses (seconds is a number): a task that fails unrun. */
const REFUSED_SLEEP_ARGUMENTS = { seconds: 'soon' };
/** A failure message far wider than any screen. */
const LONG_FAILURE = `disk quota exceeded while writing ${'/var/lib/exports/batch-0042/'.repeat(12)}part-0001.parquet`;
/** The console's widest layout (main's max-width). */
const WIDE = { width: 1400, height: 900 };

let rpcId = 0;

/**
 * One MCP request as alice; its JSON-RPC result (throws on an HTTP or
 * JSON-RPC error). Headers: Mcp-Name is the tool of tools/call and the
 * taskId of tasks/*, which the server requires to match the body.
 */
async function mcp(method, params, token = USER_TOKEN) {
  const headers = {
    'Content-Type': 'application/json',
    Accept: 'application/json, text/event-stream',
    'MCP-Protocol-Version': MCP_VERSION,
    'Mcp-Method': method,
    Authorization: `Bearer ${token}`,
  };
  const name = method === 'tools/call' ? params.name : params.taskId;
  if (name) headers['Mcp-Name'] = name;
  const id = ++rpcId;
  const body = { jsonrpc: '2.0', id, method, params: { ...params, _meta: MCP_ENVELOPE } };
  const response = await fetch(BASE + MCP_PATH, {
    method: 'POST',
    headers,
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(TIMEOUT),
  });
  const text = await response.text();
  const type = response.headers.get('content-type') || '';
  let message;
  try {
    message = type.startsWith('text/event-stream') ? lastSseMessage(text, id) : JSON.parse(text);
  } catch (e) {
    throw new Error(`MCP ${method}: HTTP ${response.status}, unreadable answer (${e.message}): ${text.slice(0, 400)}`);
  }
  if (!response.ok || !message || message.error || !message.result) {
    throw new Error(`MCP ${method}: HTTP ${response.status}: ${text.slice(0, 400)}`);
  }
  return message.result;
}

/** The JSON-RPC response with this id among the events of an SSE body. */
function lastSseMessage(text, id) {
  let found = null;
  for (const block of text.split(/\r?\n\r?\n/)) {
    const data = block
      .split(/\r?\n/)
      .filter((line) => line.startsWith('data:'))
      .map((line) => line.slice(5).replace(/^ /, ''))
      .join('\n');
    if (!data.trim()) continue;
    const message = JSON.parse(data);
    if (message.id === id) found = message;
  }
  if (!found) throw new Error('no response in the event stream');
  return found;
}

/** tools/call that must create a task: its id. */
async function createTask(tool, args, token = USER_TOKEN) {
  const result = await mcp('tools/call', { name: tool, arguments: args }, token);
  const taskId = result.taskId ?? result.task?.taskId;
  if (result.resultType !== 'task' || typeof taskId !== 'string') {
    throw new Error(`tools/call ${tool} did not create a task: ${JSON.stringify(result).slice(0, 400)}`);
  }
  return taskId;
}

// ---------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------

let browser = null;
let page = null;
let checks = 0;
/** Uncaught exceptions in the page and Content-Security-Policy violations. */
const pageProblems = [];

/** Run one check: print ok, or print not ok and stop everything. */
async function check(name, body) {
  try {
    await body();
    checks += 1;
    console.log(`ok - ${name}`);
  } catch (e) {
    console.log(`not ok - ${name}`);
    console.log(`# ${String(e && e.stack ? e.stack : e).split('\n').join('\n# ')}`);
    if (page) {
      console.log(`# page URL: ${page.url()}`);
      await page.screenshot({ path: join(SHOTS, 'FAILED.png'), fullPage: true }).catch(() => {});
      console.log(`# screenshot: ${join(SHOTS, 'FAILED.png')}`);
    }
    await finish(1);
  }
}

async function finish(code) {
  if (browser) await browser.close().catch(() => {});
  process.exit(code);
}

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

function expectEqual(actual, expected, what) {
  if (actual !== expected) {
    throw new Error(`${what}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
  }
}

async function shot(name) {
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}

/** A CSS attribute value, quoted. */
const q = (value) => JSON.stringify(String(value));

/** Log in through the form; the response to the POST. */
async function submitLogin(token) {
  await page.fill('#token', token);
  const [response] = await Promise.all([
    page.waitForResponse((r) => r.request().method() === 'POST' && new URL(r.url()).pathname === '/ui/login'),
    page.click('#login-submit'),
  ]);
  return response;
}

/** Wait until the tasks table shows the answer for the current URL. */
async function waitForTasksTable() {
  await page.waitForFunction(() => {
    const table = document.querySelector('#tasks-table');
    return table && table.dataset.state === 'loaded' && table.dataset.loadedQuery === location.search;
  });
}

/** The rows of the tasks table: id, status of the pill, tool cell text. */
async function taskRows() {
  return page.$$eval('#tasks-table tbody tr[data-task-id]', (rows) => rows.map((row) => ({
    id: row.dataset.taskId,
    status: row.querySelector('.status')?.dataset.status,
    tool: row.querySelector('td.tool')?.textContent,
  })));
}

/** Whether the tasks table fits the panel it is in, and the page is no
 *  wider than the window (no horizontal scrolling anywhere). */
async function tasksTableFits() {
  return page.evaluate(() => {
    const table = document.querySelector('#tasks-table');
    const wrap = table.parentElement;
    const doc = document.documentElement;
    return {
      table: table.getBoundingClientRect().width,
      wrap: wrap.clientWidth,
      page: doc.scrollWidth,
      window: doc.clientWidth,
      fits: table.getBoundingClientRect().width <= wrap.clientWidth + 0.5 && doc.scrollWidth <= doc.clientWidth,
    };
  });
}

/** The login page's message, and whether it is shown. */
async function loginMessage() {
  const text = (await page.textContent('#login-message')).trim();
  return { text, shown: await page.locator('#login-message').isVisible() };
}

/** Apply the tasks filters through the form. */
async function applyFilters({ status = '', tool = '', owner = '' }) {
  await page.selectOption('#filter-status', status);
  await page.fill('#filter-tool', tool);
  await page.fill('#filter-owner', owner);
  await page.click('#filter-apply');
  await page.waitForURL((url) => (url.searchParams.get('status') || '') === status
    && (url.searchParams.get('tool') || '') === tool);
  await waitForTasksTable();
}

// ---------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------

async function main() {
  setTimeout(() => {
    console.log(`not ok - the run took longer than ${RUN_LIMIT / 1000} s`);
    finish(1);
  }, RUN_LIMIT).unref();

  mkdirSync(SHOTS, { recursive: true });
  await check(`Chromium starts (${CHROMIUM})`, async () => {
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
        '--disable-background-networking', '--disable-component-update'],
    });
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    context.setDefaultTimeout(TIMEOUT);
    context.setDefaultNavigationTimeout(TIMEOUT);
    page = await context.newPage();
    page.on('dialog', (dialog) => dialog.accept());
    page.on('pageerror', (error) => pageProblems.push(`uncaught: ${error.message}`));
    page.on('console', (message) => {
      if (message.type() === 'error' && /Content.Security.Policy/i.test(message.text())) {
        pageProblems.push(`CSP: ${message.text()}`);
      }
    });
  });

  // 1. Without a token: the login page, then a refused non-operator token.
  await check('GET /ui without a token answers 401 with the login page', async () => {
    const response = await page.goto(`${BASE}/ui`);
    expectEqual(response.status(), 401, 'HTTP status of GET /ui');
    await page.locator('#token').waitFor();
    await page.locator('#login-submit').waitFor();
    const message = await loginMessage();
    expect(!message.shown && message.text === '', `an error before anything was tried: ${q(message.text)}`);
    await shot('01-login');
  });

  await check('GET /ui/login shows no error either', async () => {
    const response = await page.goto(`${BASE}/ui/login`);
    expectEqual(response.status(), 200, 'HTTP status of GET /ui/login');
    const message = await loginMessage();
    expect(!message.shown && message.text === '', `an error before anything was tried: ${q(message.text)}`);
  });

  await check('a wrong token is refused with 401 and the page says so', async () => {
    const response = await submitLogin('tbk_not_a_token');
    expectEqual(response.status(), 401, 'HTTP status of POST /ui/login');
    await page.waitForLoadState();
    const message = await loginMessage();
    expect(message.shown && /invalid|revoked|expired/i.test(message.text), `#login-message: ${q(message.text)}`);
  });

  await check('GET /ui/api/overview without a token is 401 with an error text', async () => {
    const r = await fetch(`${BASE}/ui/api/overview`, { signal: AbortSignal.timeout(TIMEOUT) });
    expectEqual(r.status, 401, 'HTTP status');
    const body = await r.json();
    expect(typeof body.error === 'string' && body.error, `no error text: ${JSON.stringify(body)}`);
  });

  await check('logging in with a non-operator token is refused with 403', async () => {
    const response = await submitLogin(USER_TOKEN);
    expectEqual(response.status(), 403, 'HTTP status of POST /ui/login');
    await page.waitForLoadState();
    const message = (await page.textContent('#login-message')).trim();
    expect(/operator/i.test(message), `#login-message does not say it is not an operator token: ${q(message)}`);
    await shot('02-refused');
  });

  await check('GET /ui/api/overview with a non-operator bearer token is 403', async () => {
    const r = await fetch(`${BASE}/ui/api/overview`, {
      headers: { Authorization: `Bearer ${USER_TOKEN}` },
      signal: AbortSignal.timeout(TIMEOUT),
    });
    expectEqual(r.status, 403, 'HTTP status');
    const body = await r.json();
    expect(typeof body.error === 'string' && body.error, `no error text: ${JSON.stringify(body)}`);
  });

  // 2. The operator's overview.
  await check('an operator token logs in and lands on the overview', async () => {
    await page.fill('#token', OPERATOR_TOKEN);
    await Promise.all([
      page.waitForURL((url) => url.pathname === '/ui'),
      page.click('#login-submit'),
    ]);
    await page.locator('#overview-cards .card').first().waitFor();
    await page.locator('#logout').waitFor();
  });

  await check('the live indicator is open within 5 s', async () => {
    await page.locator('#live[data-state="open"]').waitFor({ timeout: 5000 });
  });

  await check(`the overview has a By-tool row for ${SEEDED_TOOL} and a live worker`, async () => {
    await page.locator(`#overview-tools tbody tr[data-tool=${q(SEEDED_TOOL)}]`).waitFor();
    await page.locator('#overview-workers tbody tr[data-state="live"]').first().waitFor();
    const pill = await page.textContent('#overview-workers tbody tr[data-state="live"] .pill');
    expectEqual(pill.trim(), 'live', 'state pill of a live worker');
    await shot('03-overview');
  });

  if (UPSTREAM) {
    await check(`the overview shows the upstream server ${UPSTREAM} ready, with its tools`, async () => {
      const row = page.locator(`#overview-upstreams tbody tr[data-upstream=${q(UPSTREAM)}]`);
      await row.waitFor();
      expectEqual((await row.locator('.pill').textContent()).trim(), 'ready', 'state pill of the upstream');
      const cells = await row.locator('td').allTextContents();
      expectEqual(cells[4].trim(), '1', 'tools served from it (include = ["get-sum"])');
    });
  } else {
    await check('without upstream servers the overview has no upstream panel', async () => {
      expectEqual(await page.locator('#overview-upstreams').isVisible(), false, 'upstream panel visible');
    });
  }

  // 3. The tasks list and its filters.
  await check('Tasks filtered by status failed lists only failed tasks, the seeded one among them', async () => {
    await page.click('.nav a[data-page="tasks"]');
    await page.waitForURL((url) => url.pathname === '/ui/tasks');
    await waitForTasksTable();
    await applyFilters({ status: 'failed' });
    const rows = await taskRows();
    expect(rows.length > 0, 'no rows');
    const wrong = rows.filter((r) => r.status !== 'failed');
    expect(!wrong.length, `rows not failed: ${JSON.stringify(wrong)}`);
    expect(rows.some((r) => r.id === FAILED_TASK), `${FAILED_TASK} is not listed`);
    await shot('04-tasks-failed');
  });

  await check(`Tasks filtered by tool ${SEEDED_TOOL} lists only that tool`, async () => {
    await applyFilters({ tool: SEEDED_TOOL });
    const rows = await taskRows();
    expect(rows.length > 0, 'no rows');
    const wrong = rows.filter((r) => r.tool !== SEEDED_TOOL);
    expect(!wrong.length, `rows of another tool: ${JSON.stringify(wrong)}`);
  });

  let longTask = null;
  await check('at 1400 px the tasks table fits its panel, with a long owner and a long message', async () => {
    longTask = await createTask('fail', { message: LONG_FAILURE }, LONG_OWNER_TOKEN);
    await page.setViewportSize(WIDE);
    await page.goto(`${BASE}/ui/tasks`);
    await waitForTasksTable();
    await page.locator(`#tasks-table tbody tr[data-task-id=${q(longTask)}]`).waitFor();
    const size = await tasksTableFits();
    expect(size.fits, `the table overflows: ${JSON.stringify(size)}`);
    const cell = page.locator(`#tasks-table tbody tr[data-task-id=${q(longTask)}] td.message`);
    expect((await cell.getAttribute('title')).includes(LONG_FAILURE), 'the full message is the cell\'s title');
    const updated = await page.locator('#tasks-table thead th').last().boundingBox();
    expect(updated.x + updated.width <= WIDE.width, `the last column is cut: ${JSON.stringify(updated)}`);
    await shot('04b-tasks-wide');
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  await check('a task whose arguments were refused says so, not that the tool failed', async () => {
    const refused = await createTask('sleep', REFUSED_SLEEP_ARGUMENTS);
    await page.goto(`${BASE}/ui/tasks/${encodeURIComponent(refused)}`);
    await page.locator('#task-status[data-status="failed"]').waitFor();
    const note = page.locator('#result-note');
    await note.waitFor();
    expectEqual(await note.getAttribute('data-kind'), 'arguments-refused', 'kind of the result note');
    const text = await note.textContent();
    expect(/arguments were refused/i.test(text) && /never ran/i.test(text), `the note: ${q(text)}`);
    expect(!/tool ran/i.test(await page.textContent('#result')), 'it says the tool ran');
    await shot('04c-task-refused');
  });

  await check('a task whose tool reported a failure says the tool ran and failed', async () => {
    await page.goto(`${BASE}/ui/tasks/${encodeURIComponent(FAILED_TASK)}`);
    const note = page.locator('#result-note');
    await note.waitFor();
    expectEqual(await note.getAttribute('data-kind'), 'tool-error', 'kind of the result note');
    expect(/tool ran and reported a failure/i.test(await note.textContent()), 'the note');
  });

  // 4. A task page follows the task live: input_required, then completed.
  let approveTask = null;
  await check('an approve task created through MCP shows input_required and a pending elicitation', async () => {
    approveTask = await createTask('approve', APPROVE_ARGUMENTS);
    const response = await page.goto(`${BASE}/ui/tasks/${encodeURIComponent(approveTask)}`);
    expectEqual(response.status(), 200, 'HTTP status of the task page');
    await page.locator('#task-status[data-status="input_required"]').waitFor();
    const request = page.locator('#input-requests li[data-state="pending"]').first();
    await request.waitFor();
    const text = await request.textContent();
    expect(text.includes('elicitation/create'), `the request does not name elicitation/create: ${q(text)}`);
    expect(text.includes(APPROVE_ARGUMENTS.question), `the request does not show the question: ${q(text)}`);
    await page.locator('#live[data-state="open"]').waitFor({ timeout: 5000 });
    await shot('05-task-input-required');
  });

  await check('answering through MCP completes the task on the open page, without a reload', async () => {
    await page.evaluate(() => {
      window.consoleTestMarker = 'no reload';
    });
    const eventsBefore = Number(await page.getAttribute('#live', 'data-events')) || 0;
    const detailed = await mcp('tasks/get', { taskId: approveTask });
    const keys = Object.keys(detailed.inputRequests || {});
    expect(keys.length === 1, `expected one input request, got ${JSON.stringify(detailed).slice(0, 400)}`);
    await mcp('tasks/update', { taskId: approveTask, inputResponses: { [keys[0]]: APPROVE_ANSWER } });
    await page.locator('#timeline li[data-to="completed"]').waitFor();
    await page.locator('#task-status[data-status="completed"]').waitFor();
    expectEqual(await page.evaluate(() => window.consoleTestMarker), 'no reload', 'marker on window');
    const eventsAfter = Number(await page.getAttribute('#live', 'data-events')) || 0;
    expect(eventsAfter > eventsBefore, 'no live event reached the page');
    expectEqual(await page.locator('#cancel-button').count(), 0, 'Cancel buttons on a completed task');
    const result = await page.textContent('#result pre');
    expect(result.includes('approved'), `the result does not show the answer: ${q(result)}`);
    await shot('06-task-completed');
  });

  // 5. Cancelling a running task from its page.
  let sleepTask = null;
  await check('a sleep task shows working with progress', async () => {
    sleepTask = await createTask('sleep', SLEEP_ARGUMENTS);
    await page.goto(`${BASE}/ui/tasks/${encodeURIComponent(sleepTask)}`);
    await page.locator('#task-status[data-status="working"]').waitFor();
    await page.locator('#progress progress').waitFor();
    await page.locator('#cancel-button').waitFor();
    await shot('07-task-working');
  });

  await check('Cancel (confirmed) cancels the task', async () => {
    await page.click('#cancel-button'); // the confirm() dialog is accepted
    await page.locator('#task-status[data-status="cancelled"]').waitFor();
    await page.locator('#timeline li[data-to="cancelled"]').waitFor();
    expectEqual(await page.locator('#cancel-button').count(), 0, 'Cancel buttons on a cancelled task');
    expect(await page.locator('#error-banner').isHidden(), 'an error is shown');
    await shot('08-task-cancelled');
  });

  await check('MCP tasks/get as the owner says cancelled', async () => {
    const detailed = await mcp('tasks/get', { taskId: sleepTask });
    expectEqual(detailed.status, 'cancelled', 'status');
  });

  await check('markup in arguments and results is shown as text, never as HTML', async () => {
    const markup = '<img src="/ui/assets/none.png" id="injected"><b>bold</b>';
    const id = await createTask('sleep', { seconds: 0, message: markup });
    await page.goto(`${BASE}/ui/tasks/${encodeURIComponent(id)}`);
    await page.locator('#task-status[data-status="completed"]').waitFor();
    const args = await page.textContent('#arguments pre');
    expect(args.includes('<img src='), `the arguments do not show the markup as text: ${q(args)}`);
    const result = await page.textContent('#result pre');
    expect(result.includes('<b>bold</b>'), `the result does not show the markup as text: ${q(result)}`);
    expectEqual(await page.locator('#app img, #app b, #injected').count(), 0, 'elements made from task data');
  });

  await check('an unknown task shows the API error in #error-banner', async () => {
    await page.goto(`${BASE}/ui/tasks/no-such-task`);
    await page.locator('#error-banner:not([hidden])').waitFor();
    const text = (await page.textContent('#error-banner .text')).trim();
    expect(text.length > 0, 'the banner is empty');
  });

  // 6. Logging out.
  await check('Log out goes back to the login page, and /ui is 401 again', async () => {
    await Promise.all([
      page.waitForURL((url) => url.pathname !== '/ui/tasks/no-such-task'),
      page.click('#logout'),
    ]);
    const response = await page.goto(`${BASE}/ui`);
    expectEqual(response.status(), 401, 'HTTP status of GET /ui after logging out');
    await page.locator('#token').waitFor();
    const message = await loginMessage();
    expect(!message.shown, `an error after logging out: ${q(message.text)}`);
  });

  await check('no uncaught script error and no Content-Security-Policy violation', async () => {
    expect(!pageProblems.length, pageProblems.join('\n'));
  });

  console.log(`# all ${checks} checks passed; screenshots in ${SHOTS}`);
  await finish(0);
}

main().catch(async (e) => {
  console.log(`not ok - unexpected: ${e && e.stack ? e.stack : e}`);
  await finish(1);
});
