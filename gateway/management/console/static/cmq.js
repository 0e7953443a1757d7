// The CMQ view (UI3): topics with their subscriptions and retry state, HTTP subscriptions, the
// limits report (PF4) by rule with a CSV export, and a message's trace from the audit log.
import { get } from './api.js';
import {
  downloadText, enc, exchangeHref, field, fill, h, json, num, select, table, when,
} from './dom.js';

const TABS = [['topics', 'Topics'], ['http', 'HTTP subscriptions'], ['limits', 'Limits report'], ['trace', 'Message trace']];

function tabs(active) {
  return h('nav', { class: 'subnav', 'aria-label': 'CMQ views' }, TABS.map(([id, l]) => h('a', { href: `#/cmq/${id}`, 'aria-current': id === active ? 'page' : null }, l)));
}

function filters(s) { return (s.filterTag || s.bindingKey || []).join(', '); }

function retryState(s) {
  const head = s.head;
  if (!head) return 'none';
  const next = head.nextRetryTime ? `, next attempt ${when(head.nextRetryTime)}` : '';
  return `${head.status}, ${head.attempts} attempt(s)${next}${head.inFlight ? ', in flight' : ''}`;
}

const SUB_COLUMNS = [
  { key: 'subscriptionName', label: 'Subscription' },
  { key: 'protocol', label: 'Protocol' },
  { key: 'endpoint', label: 'Endpoint' },
  { key: 'filters', label: 'Filter tags / binding keys', value: filters },
  { key: 'notifyStrategy', label: 'Notify strategy' },
  { key: 'msgCount', label: 'Waiting or retrying', num: true },
  { key: 'head', label: 'Retry state', value: retryState },
  { key: 'blockedBy', label: 'Blocked by', value: (s) => (s.blockedBy ? json(s.blockedBy) : '') },
];

async function topics(ctx) {
  return get(ctx.vhost ? `/api/cmq/topics/${enc(ctx.vhost)}` : '/api/cmq/topics');
}

const TOPICS_PER_PAGE = 50;

// The topic list has counts only: the subscriptions (with their retry state) of each topic
// that has any, one request a topic.
async function withSubscriptions(list) {
  await Promise.all(list.map(async (t) => {
    t.subscriptions = t.subscriptionCount
      ? await get(`/api/cmq/topics/${enc(t.vhost)}/${enc(t.exchange)}/subscriptions`).catch(() => []) : [];
  }));
}

function topicsTab(ctx) {
  const body = h('div', { id: 'cmq-topics' });
  const pager = h('div', { class: 'pager' });
  let page = 1;
  async function refresh() {
    const all = await topics(ctx);
    const pages = Math.max(1, Math.ceil(all.length / TOPICS_PER_PAGE));
    page = Math.min(page, pages);
    const list = all.slice((page - 1) * TOPICS_PER_PAGE, page * TOPICS_PER_PAGE);
    await withSubscriptions(list);
    fill(pager, pages > 1 ? [
      h('button', { type: 'button', disabled: page <= 1, onclick: () => { page -= 1; refresh(); } }, '« Previous'),
      h('span', null, ` Topics page ${page} of ${pages} (${num(all.length)} topics) `),
      h('button', { type: 'button', disabled: page >= pages, onclick: () => { page += 1; refresh(); } }, 'Next »')] : null);
    fill(body, pager, list.length ? list.map((t) => h('section', { class: 'panel topic' },
      h('h3', null, h('a', { href: exchangeHref(t.vhost, t.exchange) }, t.topicName), ` (exchange ${t.exchange}, ${t.exchangeType}, vhost ${t.vhost})`),
      h('p', null, `Filter type ${t.filterType}; ${num(t.msgCount)} retained messages; max message size ${num(t.maxMsgSize)} bytes; `
        + `${num(t.subscriptionCount)} subscription(s)`),
      table(SUB_COLUMNS, t.subscriptions || [], { empty: 'No subscriptions.' }))) : h('p', null, 'No topics.'));
  }
  return { el: body, refresh };
}

function httpTab(ctx) {
  const body = h('div', { id: 'cmq-http' });
  async function refresh() {
    const list = await topics(ctx);
    await withSubscriptions(list);
    const rows = [];
    for (const t of list) for (const s of t.subscriptions || []) if (s.protocol === 'http') rows.push({ ...s, topic: t.topicName, vhost: t.vhost });
    const lastError = (s) => (s.lastError ? `${when(s.lastError.time)}: ${s.lastError.error} (message ${s.lastError.msgId})` : 'none');
    fill(body, table([{ key: 'vhost', label: 'Virtual host' }, { key: 'topic', label: 'Topic' }, ...SUB_COLUMNS,
      { key: 'lastError', label: 'Last error', value: lastError }], rows,
        { empty: 'No HTTP subscriptions.', id: 'http-subscriptions' }));
  }
  return { el: body, refresh };
}

const CSV_FIELDS = ['vhost', 'rule', 'object', 'user', 'peer', 'count', 'worst_value', 'limit', 'first_seen', 'last_seen', 'example'];

function csvCell(v) {
  let s = v === undefined || v === null ? '' : (typeof v === 'object' ? JSON.stringify(v) : String(v));
  if (/^[=+\-@\t\r]/.test(s)) s = `'${s}`; // no formula runs when the file is opened in a spreadsheet
  return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

export function limitsCsv(report) {
  const lines = [CSV_FIELDS.join(',')];
  for (const v of report.vhosts || [report]) {
    for (const rule of Object.values(v.rules || {})) {
      for (const e of rule.entries || []) lines.push(CSV_FIELDS.map((f) => csvCell(e[f])).join(','));
    }
  }
  return `${lines.join('\r\n')}\r\n`;
}

function limitsTab(ctx) {
  const body = h('div', { id: 'cmq-limits' });
  let last = null;
  const exportButton = h('button', { type: 'button', id: 'limits-csv', onclick: () => { if (last) downloadText('cmq-limits.csv', limitsCsv(last), 'text/csv'); } }, 'Export as CSV');
  async function refresh() {
    const report = await get(ctx.vhost ? `/api/cmq/limits/${enc(ctx.vhost)}` : '/api/cmq/limits');
    last = report;
    const vhosts = report.vhosts || [report];
    const rules = {};
    for (const v of vhosts) {
      for (const [id, r] of Object.entries(v.rules || {})) {
        const into = rules[id] || (rules[id] = { count: 0, not_stored: 0, entries: [] });
        into.count += r.count;
        into.not_stored += r.not_stored || 0;
        into.entries.push(...(r.entries || []));
      }
    }
    const ids = Object.keys(rules).sort();
    fill(body, h('p', null, `Profile ${report.profile || ''}; ` + vhosts.map((v) => `${v.vhost}: ${v.profile}`).join(', ')), exportButton,
      ids.length ? ids.map((id) => h('section', { class: 'panel rule', 'data-rule': id },
        h('h3', null, `${id}: ${num(rules[id].count)} time(s)${rules[id].not_stored ? `, ${num(rules[id].not_stored)} not stored` : ''}`),
        table([
          { key: 'vhost', label: 'Virtual host' }, { key: 'object', label: 'Object' }, { key: 'user', label: 'User' },
          { key: 'count', label: 'Count', num: true }, { key: 'worst_value', label: 'Worst value', num: true },
          { key: 'limit', label: 'Limit', num: true }, { key: 'last_seen', label: 'Last seen', value: (e) => when(e.last_seen) },
        ], rules[id].entries))) : h('p', { class: 'ok' }, 'Nothing CMQ would refuse so far.'));
  }
  return { el: body, refresh };
}

function traceTab(ctx) {
  const id = h('input', { id: 'trace-id', name: 'msg_id', required: true, size: 40 });
  const vhost = h('input', { id: 'trace-vhost', name: 'vhost', value: ctx.vhost || '/' });
  const hours = select('hours', [['1', 'last hour'], ['24', 'last 24 hours'], ['168', 'last 7 days']], '24');
  const out = h('div', { id: 'trace-result' });
  const form = h('form', { class: 'inline-form', id: 'trace-form' }, field('Message ID', id), field('Virtual host', vhost),
    field('Search', hours), h('button', { type: 'submit' }, 'Trace'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    fill(out, h('p', null, 'Reading the audit log...'));
    try {
      const t = await get(`/api/cmq/trace/${enc(vhost.value)}/${enc(id.value.trim())}?hours=${hours.value}`);
      const detailsOf = (r) => Object.entries(r).filter(([k]) => !['v', 'ts', 'event', 'vhost', 'msg_id'].includes(k))
        .map(([k, v]) => `${k}=${typeof v === 'object' ? JSON.stringify(v) : v}`).join('  ');
      fill(out, h('p', null, `${num(t.events.length)} event(s) in ${num(t.files)} audit file(s)${t.truncated ? ' (truncated)' : ''}.`),
        table([
          { key: 'ts', label: 'Time' }, { key: 'event', label: 'Event' },
          { key: 'where', label: 'Topic / queue', value: (r) => r.queue || r.topic || '' },
          { key: 'details', label: 'Details', value: detailsOf },
        ], t.events, { empty: 'No record of this message ID.', id: 'trace-events' }));
    } catch (e) { fill(out, h('p', { class: 'error' }, `Trace failed: ${e.message}`)); }
  });
  return { el: h('div', null, h('p', null, 'The events of one message, as the audit log recorded them (publish, route, enqueue, deliver, ack, retries, discard).'), form, out), refresh: null };
}

export function cmqView(ctx, tab) {
  const active = TABS.some(([id]) => id === tab) ? tab : 'topics';
  const inner = { topics: topicsTab, http: httpTab, limits: limitsTab, trace: traceTab }[active](ctx);
  const el = h('div', { id: 'cmq' }, h('h1', null, 'CMQ'), tabs(active), inner.el);
  return { el, refresh: inner.refresh, title: `CMQ ${active}` };
}
