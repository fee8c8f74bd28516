// taskbroker web console: a small single-page app over /ui/api/*.
//
// Three pages, routed on the client with history.pushState (the server
// serves index.html for each of these paths):
//   /ui                    overview: open/finished counts, by tool, upstreams, workers
//   /ui/tasks?status=...   task list with filters, keyset paged (before=SEQ)
//   /ui/tasks/{taskId}     one task: arguments, timeline, attempts, progress,
//                          input requests, result; Cancel while open
// Live updates come from the server-sent events at /ui/api/events.
//
// Security: everything shown from the API (arguments, results, messages,
// owners, tool names) was written by untrusted clients. It is put in the
// page ONLY through textContent / createTextNode / setAttribute, never as
// HTML. The Content-Security-Policy forbids inline scripts and styles, so
// there are none: all behaviour is wired here with addEventListener.
'use strict';

(() => {
  // ==== Constants ====

  const STATUSES = ['working', 'input_required', 'completed', 'failed', 'cancelled'];
  const OPEN_STATUSES = new Set(['working', 'input_required']);
  const PAGE_SIZE = 50;
  /** Longest JSON text put in a <pre>; the rest is cut with a note. */
  const MAX_JSON_CHARS = 200000;
  /** Colour of a pill (see console.css `[data-tone]`) for each state word. */
  const TONES = {
    // task statuses
    working: 'blue', input_required: 'amber', completed: 'green', failed: 'red', cancelled: 'grey',
    // worker states
    live: 'green', stopping: 'amber', stopped: 'grey', dead: 'red',
    // job states and job events
    queued: 'grey', running: 'blue', done: 'green',
    claimed: 'blue', requeued: 'amber', finished: 'green',
    // input request states
    pending: 'amber', answered: 'green', abandoned: 'grey',
    // upstream server states
    ready: 'green', starting: 'amber', down: 'red',
  };

  // ==== Global state ====

  /** GET /ui/api/meta, once loaded. */
  let meta = null;
  /** Resolves to meta (or null when it could not be loaded). */
  let metaReady = null;
  /** Server clock minus browser clock, ms (from overview.now). */
  let clockSkew = 0;
  /** The page on screen: { onStatus?, onProgress?, onDropped?, refresh?, dispose? }. */
  let currentPage = null;
  /** Bumped at every navigation, so late answers for an old page are dropped. */
  let generation = 0;
  /** Set once a 401 sent us to the login page: stop doing anything else. */
  let leaving = false;

  // ==== DOM helpers (text only, never HTML) ====

  /**
   * Create an element. props: class, text, data: {...} (dataset),
   * on: {event: fn}, any other key is an attribute (true = empty
   * attribute; null/undefined/false = left out). Children are nodes or
   * strings (strings become text nodes); arrays are flattened.
   */
  function h(tag, props, ...children) {
    const node = document.createElement(tag);
    if (props) {
      for (const [key, value] of Object.entries(props)) {
        if (value == null || value === false) continue;
        if (key === 'class') node.className = value;
        else if (key === 'text') node.textContent = String(value);
        else if (key === 'data') {
          for (const [k, v] of Object.entries(value)) if (v != null) node.dataset[k] = String(v);
        } else if (key === 'on') {
          for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
        } else if (value === true) node.setAttribute(key, '');
        else node.setAttribute(key, String(value));
      }
    }
    appendAll(node, children);
    return node;
  }

  function appendAll(node, children) {
    for (const child of children.flat(Infinity)) {
      if (child == null || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }

  const $ = (selector, root = document) => root.querySelector(selector);
  const dash = () => h('span', { class: 'faint' }, '—');

  /** A coloured pill for a state word (status, worker state, ...). */
  function pill(value, extraClass) {
    const word = value == null ? 'unknown' : String(value);
    return h('span', {
      class: 'pill' + (extraClass ? ' ' + extraClass : ''),
      data: { tone: TONES[word] || 'grey', status: word },
    }, word.replace(/_/g, ' '));
  }

  /** A task status pill: class `status`, data-status for the tests. */
  const statusPill = (status, extra) => pill(status, 'status' + (extra ? ' ' + extra : ''));

  /** JSON pretty-printed into a <pre>, as text. */
  function jsonPre(value) {
    let text = JSON.stringify(value, null, 2);
    if (text === undefined) text = 'null';
    if (text.length > MAX_JSON_CHARS) {
      text = text.slice(0, MAX_JSON_CHARS) +
        `\n… cut here: ${text.length.toLocaleString('en-US')} characters in all`;
    }
    return h('pre', { class: 'json' }, text);
  }

  /** A panel: header with a title (and optional extra), then a body. */
  function panel(title, options, ...body) {
    const { id, extra, flush, cls } = options || {};
    return h('section', { class: 'panel' + (cls ? ' ' + cls : ''), id },
      h('div', { class: 'panel-head' }, h('h2', null, title), extra),
      h('div', { class: 'panel-body' + (flush ? ' flush' : '') }, body));
  }

  function table(id, columns, tbody) {
    return h('div', { class: 'table-wrap' },
      h('table', { id },
        h('thead', null, h('tr', null, columns.map(([label, cls, title]) => h('th', { class: cls, title }, label)))),
        tbody));
  }

  function emptyRow(colspan, text) {
    return h('tr', { class: 'empty-row' }, h('td', { colspan, class: 'empty' }, text));
  }

  // ==== Numbers and times ====

  const nowMs = () => Date.now() + clockSkew;
  const num = (n) => (Number.isFinite(n) ? n : 0);
  const fmtInt = (n) => num(n).toLocaleString('en-US');

  /** A count cell: right aligned, tabular, zero greyed out. */
  function countCell(n, hotClass) {
    const v = num(n);
    return h('td', { class: 'num' + (v === 0 ? ' zero' : hotClass ? ' ' + hotClass : '') }, fmtInt(v));
  }

  /** A float without needless decimals: 3, 2.5, 0.33. */
  function fmtFloat(n) {
    if (!Number.isFinite(n)) return '?';
    return Number.isInteger(n) ? fmtInt(n) : n.toLocaleString('en-US', { maximumFractionDigits: 2 });
  }

  /** Seconds as a short span: "3 s", "4 min", "2 h 5 min", "3 d". */
  function fmtSpan(totalSeconds) {
    const s = Math.max(0, Math.floor(totalSeconds));
    if (s < 60) return `${s} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min`;
    const hrs = Math.floor(m / 60);
    if (hrs < 24) return m % 60 ? `${hrs} h ${m % 60} min` : `${hrs} h`;
    const d = Math.floor(hrs / 24);
    return hrs % 24 && d < 7 ? `${d} d ${hrs % 24} h` : `${d} d`;
  }

  /** A duration in ms: "250 ms", "30 s", "1 h". */
  function fmtDuration(ms) {
    if (!Number.isFinite(ms)) return '—';
    if (ms < 1000) return `${ms} ms`;
    if (ms < 60000 && ms % 1000) return `${(ms / 1000).toFixed(1)} s`;
    return fmtSpan(ms / 1000);
  }

  /** "3 s ago" / "in 5 min" / "just now". */
  function fmtAgo(ms) {
    const delta = nowMs() - ms;
    if (Math.abs(delta) < 1000) return 'just now';
    const span = fmtSpan(Math.abs(delta) / 1000);
    return delta > 0 ? `${span} ago` : `in ${span}`;
  }

  const iso = (ms) => {
    const d = new Date(ms);
    return Number.isNaN(d.getTime()) ? String(ms) : d.toISOString();
  };

  /** Local wall-clock time with ms, for timelines: 14:03:07.125. */
  function clock(ms) {
    const d = new Date(ms);
    const p = (n, w = 2) => String(n).padStart(w, '0');
    return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
  }

  function timeText(ms, mode) {
    return mode === 'age' ? fmtSpan((nowMs() - ms) / 1000) : fmtAgo(ms);
  }

  /**
   * A <time> showing a relative time (mode 'ago') or an age (mode 'age',
   * "3 min"), the exact ISO time in its title. Kept fresh by tickTimes.
   */
  function timeEl(ms, mode = 'ago') {
    if (!Number.isFinite(ms)) return dash();
    const stamp = iso(ms);
    return h('time', { datetime: stamp, title: stamp, data: { ts: ms, mode } }, timeText(ms, mode));
  }

  /** Refresh every relative time on the page (once a second). */
  function tickTimes() {
    for (const el of document.querySelectorAll('time[data-ts]')) {
      const text = timeText(Number(el.dataset.ts), el.dataset.mode);
      if (el.textContent !== text) el.textContent = text;
    }
  }

  // ==== Calling the API ====

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  /**
   * fetch + JSON. Errors become ApiError with the server's `error` text.
   * A 401 means the cookie is gone or expired: go to the login page.
   */
  async function api(path, options = {}) {
    let response;
    try {
      response = await fetch(path, {
        method: options.method || 'GET',
        headers: { Accept: 'application/json', ...(options.headers || {}) },
        body: options.body,
        credentials: 'same-origin',
        cache: 'no-store',
      });
    } catch (e) {
      throw new ApiError(0, `Cannot reach the broker (${e.message})`);
    }
    if (response.status === 401) {
      if (!leaving) {
        leaving = true;
        location.assign('/ui/login');
      }
      throw new ApiError(401, 'Not signed in');
    }
    const text = await response.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      const message = body && typeof body.error === 'string' ? body.error : `HTTP ${response.status}`;
      throw new ApiError(response.status, message);
    }
    return body;
  }

  function showError(message) {
    if (leaving) return;
    const banner = $('#error-banner');
    $('.text', banner).textContent = message;
    banner.hidden = false;
  }

  function clearError() {
    const banner = $('#error-banner');
    banner.hidden = true;
    $('.text', banner).textContent = '';
  }

  /** At most one call of fn per `ms`; a call inside the window runs at its end. */
  function throttle(fn, ms) {
    let last = 0;
    let timer = null;
    const run = () => {
      timer = null;
      last = Date.now();
      fn();
    };
    const throttled = () => {
      if (timer) return;
      const wait = last + ms - Date.now();
      if (wait <= 0) run();
      else timer = setTimeout(run, wait);
    };
    throttled.cancel = () => {
      clearTimeout(timer);
      timer = null;
    };
    return throttled;
  }

  /**
   * Wrap a page's loader so only the newest answer is drawn, and nothing
   * once the page has been left. fetcher() returns a promise; draw(data)
   * renders; fail(error) shows the error.
   */
  function latestOnly(gen, fetcher, draw, fail) {
    let seq = 0;
    return async () => {
      const mine = ++seq;
      try {
        const data = await fetcher();
        if (mine === seq && gen === generation) draw(data);
      } catch (e) {
        if (mine === seq && gen === generation && e.status !== 401) fail(e);
      }
    };
  }

  // ==== Live events (server-sent events) ====

  let source = null;
  let reconnectTimer = null;
  let reconnectDelay = 1000;
  let everOpened = false;
  let liveOpen = false;
  let eventsSeen = 0;

  function setLive(open) {
    liveOpen = open;
    const live = $('#live');
    live.dataset.state = open ? 'open' : 'closed';
    $('.label', live).textContent = open ? 'live' : everOpened ? 'reconnecting' : 'connecting';
    live.title = open ? 'Live updates: connected' : 'Live updates: not connected, retrying';
  }

  function connectEvents() {
    if (source) source.close();
    source = new EventSource('/ui/api/events');
    source.addEventListener('open', () => {
      everOpened = true;
      reconnectDelay = 1000;
      setLive(true);
      // Changes made before the stream was (re)connected were not sent: reload.
      if (currentPage && currentPage.refresh) currentPage.refresh();
    });
    source.addEventListener('error', () => {
      setLive(false);
      // CONNECTING: the browser retries by itself. CLOSED: it gave up
      // (e.g. an HTTP error answer): retry ourselves, with backoff.
      if (source.readyState === EventSource.CLOSED) scheduleReconnect();
    });
    // The server sends what changed in batches (at most 4 a second).
    source.addEventListener('changes', onChanges);
  }

  function scheduleReconnect() {
    clearTimeout(reconnectTimer);
    reconnectTimer = setTimeout(async () => {
      try {
        await api('/ui/api/meta'); // a 401 here goes to the login page
      } catch (e) {
        if (e.status === 401) return;
      }
      connectEvents();
    }, reconnectDelay);
    reconnectDelay = Math.min(reconnectDelay * 2, 30000);
  }

  /**
   * One batch: { status: [change...], progress: [report...], dropped: n }.
   * Each change and report goes to the page on screen; when the server
   * left some out (more than a batch holds), the page reads afresh.
   */
  function onChanges(event) {
    let data;
    try {
      data = JSON.parse(event.data);
    } catch (_) {
      return;
    }
    if (!data) return;
    const status = Array.isArray(data.status) ? data.status : [];
    const progress = Array.isArray(data.progress) ? data.progress : [];
    // Counted on #live (data-events) so a test can tell events arrived.
    eventsSeen += status.length + progress.length;
    $('#live').dataset.events = String(eventsSeen);
    const page = currentPage;
    if (!page) return;
    if (page.onStatus) for (const change of status) page.onStatus(change);
    if (page.onProgress) for (const report of progress) page.onProgress(report);
    if (data.dropped > 0 && page.onDropped) page.onDropped();
  }

  // ==== Routing ====

  function parseRoute() {
    const path = location.pathname.replace(/\/+$/, '');
    if (path === '/ui' || path === '') return { name: 'overview' };
    if (path === '/ui/tasks') return { name: 'tasks' };
    const m = /^\/ui\/tasks\/([^/]+)$/.exec(path);
    if (m) {
      let id;
      try {
        id = decodeURIComponent(m[1]);
      } catch (_) {
        id = m[1];
      }
      return { name: 'task', id };
    }
    return { name: 'notfound' };
  }

  /** Go to a console URL without reloading the page. */
  function navigate(url, { replace = false } = {}) {
    history[replace ? 'replaceState' : 'pushState'](null, '', url);
    renderRoute();
    window.scrollTo(0, 0);
  }

  function renderRoute() {
    if (leaving) return;
    if (currentPage && currentPage.dispose) currentPage.dispose();
    currentPage = null;
    generation += 1;
    clearError();
    const route = parseRoute();
    for (const link of document.querySelectorAll('.nav a')) {
      const active = link.dataset.page === route.name || (link.dataset.page === 'tasks' && route.name === 'task');
      link.classList.toggle('active', active);
      if (active) link.setAttribute('aria-current', 'page');
      else link.removeAttribute('aria-current');
    }
    const app = $('#app');
    app.replaceChildren();
    const pages = { overview: overviewPage, tasks: tasksPage, task: taskPage, notfound: notFoundPage };
    currentPage = pages[route.name](app, route, generation);
  }

  /** Clicks on links inside the console stay in the app. */
  function interceptLinks(event) {
    if (event.defaultPrevented || event.button !== 0) return;
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    const link = event.target.closest('a[href]');
    if (!link || link.target || link.hasAttribute('download')) return;
    const url = new URL(link.href, location.href);
    if (url.origin !== location.origin) return;
    if (!/^\/ui(\/tasks(\/[^/]+)?)?\/?$/.test(url.pathname)) return;
    event.preventDefault();
    navigate(url.pathname + url.search);
  }

  const taskHref = (id) => '/ui/tasks/' + encodeURIComponent(id);
  const tasksHref = (params) => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v != null && v !== '') q.set(k, String(v));
    const s = q.toString();
    return '/ui/tasks' + (s ? '?' + s : '');
  };

  function pageHead(title, sub, extra) {
    return h('div', { class: 'page-head' },
      h('div', null, h('h1', null, title), sub ? h('div', { class: 'sub' }, sub) : null),
      extra);
  }

  // ==== Page: Overview ====

  function overviewPage(app, _route, gen) {
    document.title = 'Overview · taskbroker';
    const updated = h('span', null, 'loading…');
    const cards = h('div', { class: 'cards', id: 'overview-cards' });
    const toolsBody = h('tbody');
    const workersBody = h('tbody');
    const toolsCount = h('span', { class: 'count' });
    const workersCount = h('span', { class: 'count' });
    const upstreamsBody = h('tbody');
    const upstreamsCount = h('span', { class: 'count' });
    // Shown only when the broker's config has upstream servers.
    const upstreamsPanel = panel('Upstream servers', { flush: true, extra: upstreamsCount },
      table('overview-upstreams', [
        ['Upstream'], ['State'], ['Since', 'num'], ['Restarts', 'num'],
        ['Tools', 'num', 'Tools served from it (from its last tools/list)'],
        ['Running', 'num', 'Calls running now on its tools'], ['Last error'],
      ], upstreamsBody));
    upstreamsPanel.hidden = true;

    app.append(
      pageHead('Overview', updated),
      cards,
      panel('By tool', { flush: true, extra: toolsCount },
        table('overview-tools', [
          ['Tool'], ['Queued', 'num'], ['Oldest queued', 'num', 'How long the oldest queued job has been runnable'],
          ['Running', 'num', 'Jobs leased to a worker, tasks waiting for input included'],
          ['Finished / min', 'num'], ['Finished / h', 'num'], ['Failed / h', 'num'], ['Last failure'],
        ], toolsBody)),
      upstreamsPanel,
      panel('Workers', { flush: true, extra: workersCount },
        table('overview-workers', [
          ['Worker'], ['Kind'], ['State'], ['Host'], ['PID', 'num'],
          ['Jobs / slots', 'num', 'Jobs leased to this pool (tasks waiting for input included: they hold no slot) / jobs it runs at once'],
          ['Heartbeat', 'num'], ['Started', 'num'],
        ], workersBody)),
    );

    function card(label, value, detail, tone, href) {
      return h('a', { class: 'card', href, data: { tone } },
        h('div', { class: 'label' }, label),
        h('div', { class: 'value' }, fmtInt(value)),
        h('div', { class: 'detail' }, detail));
    }

    function drawCards(data) {
      const open = data.open || {};
      const finished = data.finished || {};
      const finishedCard = (status, label, tone) => {
        const f = finished[status] || {};
        return card(`${label} · last hour`, f.lastHour,
          [h('strong', null, fmtInt(f.lastMinute)), ' in the last minute'], tone,
          tasksHref({ status }));
      };
      cards.replaceChildren(
        card('Working', open.working, 'running or queued now', 'blue', tasksHref({ status: 'working' })),
        card('Input required', open.input_required, 'waiting for a client', 'amber',
          tasksHref({ status: 'input_required' })),
        finishedCard('completed', 'Completed', 'green'),
        finishedCard('failed', 'Failed', 'red'),
        finishedCard('cancelled', 'Cancelled', 'grey'),
      );
    }

    function drawTools(tools) {
      toolsCount.textContent = `${tools.length} tool${tools.length === 1 ? '' : 's'}`;
      if (!tools.length) {
        toolsBody.replaceChildren(emptyRow(8, 'No tool has run yet.'));
        return;
      }
      toolsBody.replaceChildren(...tools.map((t) => {
        const oldestAge = Number.isFinite(t.oldestQueuedAt) ? nowMs() - t.oldestQueuedAt : null;
        const failure = t.lastFailure != null || t.lastFailureAt != null
          ? h('td', { class: 'failure' },
            h('span', { class: 'text', title: t.lastFailure || '' }, t.lastFailure || '(no message)'),
            h('span', { class: 'when' }, timeEl(t.lastFailureAt)))
          : h('td', null, dash());
        return h('tr', { data: { tool: t.tool } },
          h('td', null, h('a', { href: tasksHref({ tool: t.tool }) }, t.tool)),
          countCell(t.queued),
          h('td', { class: 'num' + (oldestAge != null && oldestAge > 60000 ? ' warn' : '') },
            oldestAge == null ? dash() : timeEl(t.oldestQueuedAt, 'age')),
          countCell(t.running),
          countCell(t.finishedLastMinute),
          countCell(t.finishedLastHour),
          countCell(t.failedLastHour, 'bad'),
          failure);
      }));
    }

    function drawUpstreams(upstreams) {
      upstreamsPanel.hidden = upstreams.length === 0;
      const ready = upstreams.filter((u) => u.state === 'ready').length;
      upstreamsCount.textContent = `${ready} ready of ${upstreams.length}`;
      upstreamsBody.replaceChildren(...upstreams.map((u) => h('tr', { data: { upstream: u.name, state: u.state } },
        h('td', null, u.name),
        h('td', null, pill(u.state)),
        h('td', { class: 'num' }, timeEl(u.since)),
        countCell(u.restarts, 'bad'),
        countCell(u.tools),
        countCell(u.running),
        u.lastError
          ? h('td', { class: 'failure' }, h('span', { class: 'text', title: u.lastError }, u.lastError))
          : h('td', null, dash()))));
    }

    function drawWorkers(workers) {
      const live = workers.filter((w) => w.state === 'live').length;
      workersCount.textContent = `${live} live of ${workers.length}`;
      if (!workers.length) {
        workersBody.replaceChildren(emptyRow(8, 'No worker has registered.'));
        return;
      }
      workersBody.replaceChildren(...workers.map((w) => h('tr', { data: { workerId: w.workerId, state: w.state } },
        h('td', { class: 'id' }, w.workerId),
        h('td', null, w.kind || dash()),
        h('td', null, pill(w.state)),
        h('td', null, w.host || dash()),
        h('td', { class: 'num' }, w.pid != null ? String(w.pid) : dash()),
        h('td', { class: 'num' }, `${fmtInt(w.jobsRunning)} / ${fmtInt(w.concurrency)}`),
        h('td', { class: 'num' }, timeEl(w.heartbeatAt)),
        h('td', { class: 'num' },
          w.stoppedAt != null
            ? h('span', { title: `stopped ${iso(w.stoppedAt)}` }, timeEl(w.startedAt))
            : timeEl(w.startedAt)))));
    }

    const load = latestOnly(gen, () => api('/ui/api/overview'), (data) => {
      if (Number.isFinite(data.now)) clockSkew = data.now - Date.now();
      drawCards(data);
      drawTools(Array.isArray(data.tools) ? data.tools : []);
      drawUpstreams(Array.isArray(data.upstreams) ? data.upstreams : []);
      drawWorkers(Array.isArray(data.workers) ? data.workers : []);
      updated.replaceChildren('Updated ', timeEl(Number.isFinite(data.now) ? data.now : nowMs()),
        ' · refreshes on task changes');
    }, (e) => showError(e.message));

    const throttled = throttle(load, 2000);
    const fallback = setInterval(() => {
      if (!document.hidden) load();
    }, 10000);
    load();
    return {
      onStatus: throttled,
      refresh: load,
      dispose() {
        clearInterval(fallback);
        throttled.cancel();
      },
    };
  }

  // ==== Page: Tasks ====

  function tasksPage(app, _route, gen) {
    document.title = 'Tasks · taskbroker';
    const query = new URLSearchParams(location.search);
    const filters = {
      status: (query.get('status') || '').split(',').map((s) => s.trim()).filter(Boolean).join(','),
      tool: query.get('tool') || '',
      owner: query.get('owner') || '',
    };
    const before = query.get('before') || '';
    const statusSet = new Set(filters.status ? filters.status.split(',') : []);

    // filter bar
    const statusSelect = h('select', { id: 'filter-status', name: 'status' },
      h('option', { value: '' }, 'any'),
      h('option', { value: 'working,input_required' }, 'open (working, input required)'),
      STATUSES.map((s) => h('option', { value: s }, s.replace(/_/g, ' '))));
    if (filters.status && ![...statusSelect.options].some((o) => o.value === filters.status)) {
      statusSelect.append(h('option', { value: filters.status }, filters.status.replace(/,/g, ', ')));
    }
    statusSelect.value = filters.status;
    const toolList = h('datalist', { id: 'filter-tool-list' });
    const toolInput = h('input', {
      type: 'text', id: 'filter-tool', name: 'tool', list: 'filter-tool-list',
      placeholder: 'any tool', autocomplete: 'off', spellcheck: 'false',
    });
    toolInput.value = filters.tool;
    const ownerInput = h('input', {
      type: 'text', id: 'filter-owner', name: 'owner', placeholder: 'any owner', autocomplete: 'off',
      spellcheck: 'false',
    });
    ownerInput.value = filters.owner;
    if (metaReady) {
      metaReady.then((m) => {
        const tools = m && Array.isArray(m.tools) ? m.tools : [];
        toolList.replaceChildren(...tools.map((t) => h('option', { value: t })));
      });
    }
    const form = h('form', { class: 'filters', id: 'filters' },
      h('div', { class: 'field' }, h('label', { for: 'filter-status' }, 'Status'), statusSelect),
      h('div', { class: 'field' }, h('label', { for: 'filter-tool' }, 'Tool'), toolInput, toolList),
      h('div', { class: 'field' }, h('label', { for: 'filter-owner' }, 'Owner'), ownerInput),
      h('button', { type: 'submit', id: 'filter-apply', class: 'btn primary' }, 'Apply'),
      filters.status || filters.tool || filters.owner
        ? h('a', { class: 'btn link', href: '/ui/tasks' }, 'Clear filters')
        : null);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      navigate(tasksHref({
        status: statusSelect.value,
        tool: toolInput.value.trim(),
        owner: ownerInput.value.trim(),
      }));
    });

    // table and pager
    const tbody = h('tbody', null, emptyRow(7, 'Loading…'));
    const tableWrap = table('tasks-table', [
      ['Task'], ['Tool'], ['Status'], ['Message'], ['Owner'], ['Created', 'num'], ['Updated', 'num'],
    ], tbody);
    const tableEl = $('table', tableWrap);
    tableEl.dataset.state = 'loading';
    const notice = h('div', { class: 'notice', hidden: true });
    const pageInfo = h('span');
    const firstPage = h('a', { class: 'btn', id: 'first-page', href: tasksHref(filters) }, '← First page');
    if (!before) firstPage.hidden = true;
    const nextPage = h('button', { type: 'button', id: 'next-page', class: 'btn', disabled: true }, 'Older →');
    let nextBefore = null;
    nextPage.addEventListener('click', () => {
      if (nextBefore != null) navigate(tasksHref({ ...filters, before: nextBefore }));
    });
    const describe = [
      filters.status ? `status ${filters.status.replace(/,/g, ' or ')}` : null,
      filters.tool ? `tool “${filters.tool}”` : null,
      filters.owner ? `owner “${filters.owner}”` : null,
    ].filter(Boolean);

    app.append(
      pageHead('Tasks', describe.length ? `Filtered by ${describe.join(', ')}` : 'All tasks, newest first'),
      h('section', { class: 'panel' },
        form,
        notice,
        tableWrap,
        h('div', { class: 'pager' }, pageInfo, h('div', { class: 'buttons' }, firstPage, nextPage))),
    );

    /** taskId -> the row's live cells, for in-place updates. */
    const rows = new Map();
    let newCount = 0;

    function row(t) {
      const statusCell = h('td', null, statusPill(t.status));
      const messageCell = h('td', { class: 'message', title: t.statusMessage || null },
        t.statusMessage || '');
      const updatedCell = h('td', { class: 'num' }, timeEl(t.updatedAt));
      const tr = h('tr', { data: { taskId: t.taskId, tool: t.tool, status: t.status, seq: t.seq } },
        h('td', { class: 'id' }, h('a', { href: taskHref(t.taskId) }, t.taskId)),
        h('td', { class: 'tool' }, t.tool),
        statusCell,
        messageCell,
        h('td', { class: 'owner', title: t.owner || null }, t.owner || dash()),
        h('td', { class: 'num' }, timeEl(t.createdAt)),
        updatedCell);
      rows.set(t.taskId, { tr, statusCell, messageCell, updatedCell });
      return tr;
    }

    const load = latestOnly(gen, () => {
      const q = new URLSearchParams();
      if (filters.status) q.set('status', filters.status);
      if (filters.tool) q.set('tool', filters.tool);
      if (filters.owner) q.set('owner', filters.owner);
      if (before) q.set('before', before);
      q.set('limit', String(PAGE_SIZE));
      return api('/ui/api/tasks?' + q.toString());
    }, (data) => {
      const tasks = Array.isArray(data.tasks) ? data.tasks : [];
      rows.clear();
      newCount = 0;
      notice.hidden = true;
      tbody.replaceChildren(...(tasks.length
        ? tasks.map(row)
        : [emptyRow(7, before ? 'No older tasks.' : 'No task matches these filters.')]));
      nextBefore = data.nextBefore != null ? data.nextBefore : null;
      nextPage.disabled = nextBefore == null;
      pageInfo.textContent = tasks.length
        ? `${tasks.length} task${tasks.length === 1 ? '' : 's'} on this page${before ? ' (older page)' : ''}`
        : '';
      tableEl.dataset.state = 'loaded';
      tableEl.dataset.loadedQuery = location.search;
    }, (e) => {
      tableEl.dataset.state = 'error';
      tbody.replaceChildren(emptyRow(7, 'Could not load tasks.'));
      showError(e.message);
    });

    /** A status event: update the row in place, or count a new task. */
    function onStatus(ev) {
      const entry = rows.get(ev.taskId);
      if (entry) {
        entry.statusCell.replaceChildren(statusPill(ev.to));
        entry.tr.dataset.status = ev.to;
        entry.messageCell.textContent = ev.message || '';
        if (ev.message) entry.messageCell.title = ev.message;
        else entry.messageCell.removeAttribute('title');
        if (Number.isFinite(ev.at)) entry.updatedCell.replaceChildren(timeEl(ev.at));
        entry.tr.classList.remove('flash');
        void entry.tr.offsetWidth; // restart the animation
        entry.tr.classList.add('flash');
        return;
      }
      // A task created since this page loaded, that would show on the
      // first page (events carry no tool: not counted under a tool filter).
      const created = ev.from == null;
      const matches = !before && !filters.tool &&
        (!filters.owner || ev.owner === filters.owner) &&
        (statusSet.size === 0 || statusSet.has(ev.to));
      if (created && matches) {
        newCount += 1;
        notice.replaceChildren(
          h('span', null, `${newCount} new task${newCount === 1 ? '' : 's'} since this page loaded`),
          h('button', { type: 'button', class: 'btn link', on: { click: load } }, 'Show'));
        notice.hidden = false;
      }
    }

    /** Changes came faster than a batch holds: rows may be stale. */
    function onDropped() {
      notice.replaceChildren(
        h('span', null, 'Tasks are changing faster than this list follows'),
        h('button', { type: 'button', class: 'btn link', on: { click: load } }, 'Reload'));
      notice.hidden = false;
    }

    load();
    return { onStatus, onDropped, refresh: load };
  }

  // ==== Page: one task ====

  function taskPage(app, route, gen) {
    const id = route.id;
    document.title = `Task ${id} · taskbroker`;
    app.append(h('div', { class: 'empty' }, 'Loading task…'));
    const apiPath = '/ui/api/tasks/' + encodeURIComponent(id);
    /** The last answer drawn, as JSON text: an identical answer is not redrawn. */
    let lastText = null;
    let lastStatus = null;
    /** Task ended (e.g. cancelled) but its job still runs: no event will say when it stops. */
    let jobWindingDown = false;

    const load = latestOnly(gen, () => api(apiPath), (data) => {
      const text = JSON.stringify(data);
      if (text === lastText) return;
      lastText = text;
      lastStatus = data.task && data.task.status;
      jobWindingDown = !OPEN_STATUSES.has(lastStatus) && !!data.job && data.job.state !== 'done';
      app.replaceChildren(...drawTask(data));
    }, (e) => {
      if (e.status === 404) {
        lastText = null;
        app.replaceChildren(
          h('div', { class: 'crumbs' }, h('a', { href: '/ui/tasks' }, 'Tasks'), ' / ', id),
          h('section', { class: 'panel' }, h('div', { class: 'empty' },
            h('p', null, `No task ${id}.`),
            h('p', { class: 'muted' }, e.message))));
      }
      showError(e.message);
    });

    async function cancel(button) {
      if (!window.confirm(`Cancel task ${id}?\n\nThe tool is asked to stop and the task ends as cancelled.`)) return;
      button.disabled = true;
      button.textContent = 'Cancelling…';
      try {
        await api(apiPath + '/cancel', {
          method: 'POST',
          headers: { 'Content-Type': 'application/json' },
          body: '{}',
        });
        clearError();
      } catch (e) {
        if (e.status === 401) return;
        showError(`Cancel refused: ${e.message}`);
      }
      lastText = null; // redraw even if nothing changed (restores the button)
      load();
    }

    function drawTask(data) {
      const t = data.task || {};
      document.title = `Task ${t.taskId || id} · ${t.status || ''} · taskbroker`;
      const open = OPEN_STATUSES.has(t.status);

      // header
      const cancelButton = open
        ? h('button', { type: 'button', id: 'cancel-button', class: 'btn danger' }, 'Cancel task')
        : null;
      if (cancelButton) cancelButton.addEventListener('click', () => cancel(cancelButton));
      const fact = (label, value) => h('div', null, h('dt', null, label), h('dd', null, value));
      const head = h('section', { class: 'task-head' },
        h('div', { class: 'crumbs' }, h('a', { href: '/ui/tasks' }, 'Tasks'), ' / ',
          h('a', { href: tasksHref({ tool: t.tool }) }, t.tool || '?')),
        h('div', { class: 'title-row' },
          h('h1', { id: 'task-id' }, t.taskId || id),
          h('span', { id: 'task-status', class: 'pill large status', data: { status: t.status, tone: TONES[t.status] || 'grey' } },
            String(t.status || 'unknown').replace(/_/g, ' ')),
          h('div', { class: 'actions' }, cancelButton)),
        t.statusMessage ? h('div', { class: 'status-message', id: 'task-status-message' }, t.statusMessage) : null,
        h('dl', { class: 'facts' },
          fact('Tool', h('a', { href: tasksHref({ tool: t.tool }) }, t.tool || '?')),
          fact('Owner', t.owner ? h('a', { href: tasksHref({ owner: t.owner }) }, t.owner) : dash()),
          fact('Created', timeEl(t.createdAt)),
          fact('Updated', timeEl(t.updatedAt)),
          fact('TTL', t.ttlMs != null ? fmtDuration(t.ttlMs) : 'none'),
          fact('Expires', t.expiresAt != null ? timeEl(t.expiresAt) : 'never'),
          fact('Poll interval', t.pollIntervalMs != null ? fmtDuration(t.pollIntervalMs) : dash()),
          fact('Sequence', t.seq != null ? h('span', { class: 'mono' }, String(t.seq)) : dash())));

      const result = drawResult(t);
      const args = panel('Arguments', { id: 'arguments' }, jsonPre(t.arguments === undefined ? null : t.arguments));
      const inputs = drawInputRequests(Array.isArray(data.messages) ? data.messages : []);
      // While open, what the task waits for comes first; once done, its result.
      const left = h('div', null,
        open ? [inputs, args, result] : [result, args, inputs],
        drawAttempts(data.job, Array.isArray(data.jobEvents) ? data.jobEvents : []));
      const right = h('div', null,
        drawTimeline(Array.isArray(data.events) ? data.events : []),
        drawProgress(Array.isArray(data.progress) ? data.progress : []));
      return [head, h('div', { class: 'task-grid' }, left, right)];
    }

    function drawResult(t) {
      const isToolError = t.resultKind === 'result' && t.result && t.result.isError === true;
      const refused = isToolError && t.argumentsRefused === true;
      const failed = t.resultKind === 'error' || isToolError;
      const title = t.resultKind === 'error' ? 'Error'
        : refused ? 'Result · arguments refused'
          : isToolError ? 'Result · tool error' : 'Result';
      let body;
      if (t.resultKind == null) {
        body = h('div', { class: 'muted' },
          OPEN_STATUSES.has(t.status) ? `No result yet: the task is ${String(t.status).replace(/_/g, ' ')}.` : 'No result stored.');
      } else {
        body = [
          jsonPre(t.result),
          refused
            ? h('div', { class: 'note', id: 'result-note', data: { kind: 'arguments-refused' } },
              'The arguments were refused: they do not match the tool\'s inputSchema, so the tool never ran.')
            : isToolError
              ? h('div', { class: 'note', id: 'result-note', data: { kind: 'tool-error' } },
                'The tool ran and reported a failure (isError: true).')
              : null,
        ];
      }
      return panel(title, { id: 'result', cls: failed ? 'failed' : null }, body);
    }

    function drawTimeline(events) {
      const sorted = [...events].sort((a, b) => num(a.at) - num(b.at) || num(a.id) - num(b.id));
      const list = h('ol', { id: 'timeline' }, sorted.map((ev, i) => {
        const prev = i > 0 ? sorted[i - 1] : null;
        const gap = prev && Number.isFinite(ev.at) && Number.isFinite(prev.at) ? ev.at - prev.at : null;
        return h('li', { data: { to: ev.to, from: ev.from } },
          h('span', { class: 'marker', data: { tone: TONES[ev.to] || 'grey' } }),
          h('div', { class: 'transition' },
            ev.from ? [pill(ev.from), h('span', { class: 'arrow' }, '→')] : h('span', { class: 'muted' }, 'created'),
            pill(ev.to)),
          ev.message ? h('div', { class: 'event-message' }, ev.message) : null,
          h('div', { class: 'when' }, timeEl(ev.at), Number.isFinite(ev.at) ? ` · ${clock(ev.at)}` : '',
            gap != null ? ` · +${fmtDuration(gap)}` : ''));
      }));
      return panel('Status timeline', { extra: h('span', { class: 'count' }, `${events.length} event${events.length === 1 ? '' : 's'}`) },
        events.length ? list : [list, h('div', { class: 'muted' }, 'No status change recorded.')]);
    }

    function drawProgress(reports) {
      const sorted = [...reports].sort((a, b) => num(a.id) - num(b.id) || num(a.at) - num(b.at));
      if (!sorted.length) {
        return panel('Progress', { id: 'progress' }, h('div', { class: 'muted' }, 'No progress reported.'));
      }
      const latest = sorted[sorted.length - 1];
      const total = Number.isFinite(latest.total) && latest.total > 0 ? latest.total : null;
      const bar = h('progress', { id: 'progress-bar' });
      if (total != null) {
        bar.max = total;
        bar.value = Math.min(num(latest.progress), total);
      } else {
        bar.removeAttribute('value'); // indeterminate
      }
      const figure = total != null
        ? `${fmtFloat(latest.progress)} / ${fmtFloat(total)} · ${Math.round((num(latest.progress) / total) * 100)}%`
        : fmtFloat(latest.progress);
      const recent = sorted.slice(-10).reverse();
      return panel('Progress', { id: 'progress', extra: h('span', { class: 'count' }, timeEl(latest.at)) },
        h('div', { class: 'progress-row' }, bar, h('span', { class: 'progress-figure' }, figure)),
        latest.message ? h('div', { class: 'progress-message' }, latest.message) : null,
        h('div', { class: 'sublabel' }, `Last reports (${sorted.length > 10 ? `10 of ${sorted.length}` : sorted.length}), newest first`),
        h('ul', { class: 'reports' }, recent.map((r) => h('li', null,
          h('span', { class: 'fig' }, r.total != null ? `${fmtFloat(r.progress)} / ${fmtFloat(r.total)}` : fmtFloat(r.progress)),
          h('span', { class: 'msg', title: r.message || null }, r.message || ''),
          h('span', { class: 'when' }, timeEl(r.at))))));
    }

    function drawInputRequests(messages) {
      const list = h('ul', { id: 'input-requests' }, messages.map((m) => {
        const params = m.params;
        const question = params && typeof params === 'object' && typeof params.message === 'string' ? params.message : null;
        return h('li', { data: { state: m.state, requestId: m.requestId, method: m.method } },
          h('div', { class: 'request-head' },
            h('span', { class: 'method' }, m.method || '?'),
            pill(m.state),
            h('span', { class: 'times' }, 'asked ', timeEl(m.createdAt),
              m.answeredAt != null ? [' · answered ', timeEl(m.answeredAt)] : null)),
          question ? h('p', { class: 'request-question' }, question) : null,
          h('div', { class: 'sublabel' }, 'Params'),
          jsonPre(params === undefined ? null : params),
          m.response != null ? [h('div', { class: 'sublabel' }, 'Response'), jsonPre(m.response)] : null);
      }));
      const pending = messages.filter((m) => m.state === 'pending').length;
      return panel('Input requests', {
        flush: true,
        extra: h('span', { class: 'count' }, messages.length ? `${messages.length} (${pending} pending)` : ''),
      }, list, messages.length ? null : h('div', { class: 'empty' }, 'The task has asked the client nothing.'));
    }

    function drawAttempts(job, jobEvents) {
      if (!job) {
        return panel('Attempts', { id: 'attempts' }, h('div', { class: 'muted' }, 'No job record for this task (no attempt was made).'));
      }
      const fact = (label, value) => h('div', null, h('dt', null, label), h('dd', null, value));
      const facts = h('dl', { class: 'facts job-facts' },
        fact('Job state', pill(job.state)),
        fact('Attempt', `${fmtInt(job.attempt)} of ${fmtInt(job.maxAttempts)}`),
        fact('Priority', job.priority != null ? String(job.priority) : dash()),
        fact('Run after', timeEl(job.runAfter)),
        fact('Lease owner', job.leaseOwner ? h('span', { class: 'mono', title: job.leaseOwner }, job.leaseOwner) : dash()),
        fact('Lease expires', timeEl(job.leaseExpiresAt)),
        fact('Cancel requested', job.cancelRequested ? h('span', { class: 'warn' }, 'yes') : 'no'),
        fact('Finished', timeEl(job.finishedAt)));
      const sorted = [...jobEvents].sort((a, b) => num(a.at) - num(b.at) || num(a.id) - num(b.id));
      const tbody = h('tbody', null, sorted.length
        ? sorted.map((e) => h('tr', { data: { event: e.event } },
          h('td', { class: 'num' }, fmtInt(e.attempt)),
          h('td', null, pill(e.event)),
          h('td', { class: 'id' }, e.worker || dash()),
          h('td', { class: 'message', title: e.reason || null }, e.reason || ''),
          h('td', { class: 'num' }, timeEl(e.at))))
        : emptyRow(5, 'No attempt yet.'));
      return panel('Attempts', { id: 'attempts', flush: true },
        h('div', { class: 'panel-body' },
          facts,
          job.lastError ? [h('div', { class: 'sublabel' }, 'Last error'), h('pre', { class: 'json' }, job.lastError)] : null),
        table('job-events', [['Attempt', 'num'], ['Event'], ['Worker'], ['Reason'], ['Time', 'num']], tbody));
    }

    const throttled = throttle(load, 500);
    // Polled only when events cannot tell: live events down while the task
    // is open, or the job of an ended task still winding down.
    const poll = setInterval(() => {
      if (document.hidden) return;
      if (jobWindingDown || (!liveOpen && (lastStatus == null || OPEN_STATUSES.has(lastStatus)))) load();
    }, 3000);
    load();
    const mine = (ev) => {
      if (ev.taskId === id) throttled();
    };
    return {
      onStatus: mine,
      onProgress: mine,
      onDropped: throttled,
      refresh: load,
      dispose() {
        clearInterval(poll);
        throttled.cancel();
      },
    };
  }

  // ==== Page: not found ====

  function notFoundPage(app) {
    document.title = 'Not found · taskbroker';
    app.append(h('section', { class: 'panel' }, h('div', { class: 'empty' },
      h('p', null, 'There is no console page here.'),
      h('a', { href: '/ui' }, 'Go to the overview'))));
    return {};
  }

  // ==== Start ====

  function loadMeta() {
    metaReady = api('/ui/api/meta').then((m) => {
      meta = m || {};
      const info = [meta.version ? `v${meta.version}` : null, meta.database || null].filter(Boolean).join(' · ');
      $('#server-info').textContent = info;
      $('#principal').textContent = meta.principal ? meta.principal : '';
      if (meta.principal) $('#principal').title = `Signed in as ${meta.principal}`;
      $('#logout-form').hidden = !meta.tokens;
      return meta;
    }, (e) => {
      if (e.status !== 401) showError(e.message);
      return null;
    });
  }

  function start() {
    $('#error-banner .close').addEventListener('click', clearError);
    document.addEventListener('click', interceptLinks);
    window.addEventListener('popstate', renderRoute);
    $('#logout-form').addEventListener('submit', () => {
      leaving = true;
      if (source) source.close();
    });
    loadMeta();
    setLive(false);
    connectEvents();
    renderRoute();
    setInterval(tickTimes, 1000);
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
