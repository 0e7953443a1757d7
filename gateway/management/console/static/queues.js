// Queues: the list (sorted, filtered and paged by the API, so 10,000 queues cost one page of
// rows in the browser) and a queue's page.
import { api, get } from './api.js';
import { Series, chart } from './chart.js';
import {
  button, details, enc, features, exchangeHref, field, fill, h, json, num, pre, queueHref, rate, section, select, table,
} from './dom.js';
import { fillPager, getPage, listToolbar, summaryText } from './pages.js';

// What the queues list costs in this browser (ms, performance.now): read by the scale test
// and by anyone curious, from the devtools console as cmqConsolePerf.
export const perf = { firstRender: null, lastRefresh: null, lastApi: null, refreshes: 0, history: [] };
globalThis.cmqConsolePerf = perf;


export function queuesView(ctx) {
  const state = { page: 1, size: 100, sort: 'name', reverse: false, filter: '', regex: true };
  const saved = JSON.parse(sessionStorage.getItem('cmq-console-queues') || 'null');
  if (saved) Object.assign(state, saved, { page: saved.page || 1 });
  const save = () => sessionStorage.setItem('cmq-console-queues', JSON.stringify(state));
  const list = h('div', { id: 'queues-table' });
  const pager = h('div', { class: 'pager' });
  const summary = h('p', { class: 'summary', id: 'queues-summary' });
  const toolbar = listToolbar(state, { id: 'queue', changed: () => { save(); refresh(); } });
  const addForm = addQueueForm(ctx, () => refresh());
  const el = h('div', { id: 'queues' }, h('h1', null, 'Queues'),
    toolbar, summary, list, pager, addForm);
  const columns = [
    ctx.vhost ? null : { key: 'vhost', label: 'Virtual host', sort: 'vhost' },
    { key: 'name', label: 'Name', sort: 'name', value: (q) => h('a', { href: queueHref(q.vhost, q.name) }, q.name) },
    { key: 'type', label: 'Type', value: (q) => q.type || 'classic' },
    { key: 'features', label: 'Features', value: features },
    { key: 'state', label: 'State', sort: 'state' },
    { key: 'consumers', label: 'Consumers', sort: 'consumers', num: true },
    { key: 'messages_ready', label: 'Ready', sort: 'messages_ready', num: true },
    { key: 'messages_unacknowledged', label: 'Unacked', sort: 'messages_unacknowledged', num: true },
    { key: 'messages', label: 'Total', sort: 'messages', num: true },
    { key: 'in', label: 'Incoming', num: true, value: (q) => rate((q.message_stats || {}).publish_details) },
    { key: 'out', label: 'Deliver / get', num: true, value: (q) => rate((q.message_stats || {}).deliver_get_details) },
    { key: 'ack', label: 'Ack', num: true, value: (q) => rate((q.message_stats || {}).ack_details) },
  ].filter(Boolean);
  function onSort(key) {
    if (state.sort === key) state.reverse = !state.reverse; else { state.sort = key; state.reverse = false; }
    save();
    refresh();
  }
  async function refresh() {
    const t0 = performance.now();
    const base = ctx.vhost ? `/api/queues/${enc(ctx.vhost)}` : '/api/queues';
    const ta = performance.now();
    const data = await getPage(base, state);
    perf.lastApi = performance.now() - ta;
    save();
    fill(summary, summaryText(data, 'queues'));
    fill(list, table(columns, data.items, { sort: state.sort, reverse: state.reverse, onSort, empty: 'No queues.', id: 'queues-list' }));
    fillPager(pager, state, data, () => { save(); refresh(); });
    const took = performance.now() - t0;
    if (perf.firstRender === null) perf.firstRender = took;
    perf.lastRefresh = took;
    perf.refreshes += 1;
    perf.history.push({ total: took, api: perf.lastApi, rows: data.item_count });
    if (perf.history.length > 50) perf.history.shift();
  }
  return { el, refresh, title: 'Queues' };
}

function addQueueForm(ctx, done) {
  const name = h('input', { name: 'name', required: true });
  const vhost = h('input', { name: 'vhost', value: ctx.vhost || '/' });
  const durable = select('durable', [['true', 'Durable'], ['false', 'Transient']], 'true');
  const args = h('textarea', { name: 'arguments', rows: 2, placeholder: '{"x-message-ttl": 60000}' });
  const form = h('form', { class: 'inline-form', id: 'add-queue' },
    field('Virtual host', vhost), field('Name', name), field('Durability', durable), field('Arguments (JSON)', args),
    h('button', { type: 'submit' }, 'Add queue'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      const body = { durable: durable.value === 'true', auto_delete: false, arguments: args.value.trim() ? JSON.parse(args.value) : {} };
      await api('PUT', `/api/queues/${enc(vhost.value)}/${enc(name.value)}`, body);
      ctx.flash(`Queue ${name.value} declared.`);
      name.value = '';
      done();
    } catch (e) { ctx.flash(e.message, 'error'); }
  });
  return section('Add a new queue', form);
}

export function publishForm(ctx, vhost, exchange, routingKey) {
  const key = h('input', { name: 'routing_key', value: routingKey ?? '' });
  const mode = select('delivery_mode', [['2', 'Persistent'], ['1', 'Non-persistent']], '2');
  const headers = h('textarea', { name: 'headers', rows: 2, placeholder: '{"x-cmq-tags": ["a"]}' });
  const props = h('textarea', { name: 'properties', rows: 2, placeholder: '{"content_type": "text/plain"}' });
  const payload = h('textarea', { name: 'payload', rows: 4 });
  const encoding = select('payload_encoding', [['string', 'String'], ['base64', 'Base64']], 'string');
  const form = h('form', { class: 'inline-form', id: 'publish-form' },
    routingKey === undefined ? field('Routing key', key) : null,
    field('Delivery mode', mode), field('Headers (JSON)', headers), field('Properties (JSON)', props),
    field('Payload', payload), field('Payload encoding', encoding),
    h('button', { type: 'submit' }, 'Publish message'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      const properties = props.value.trim() ? JSON.parse(props.value) : {};
      properties.delivery_mode = Number(mode.value);
      if (headers.value.trim()) properties.headers = JSON.parse(headers.value);
      const out = await api('POST', `/api/exchanges/${enc(vhost)}/${enc(exchange || 'amq.default')}/publish`,
        { routing_key: key.value, properties, payload: payload.value, payload_encoding: encoding.value });
      ctx.flash(out.routed ? 'Message published.' : 'Message published, but not routed.', out.routed ? 'info' : 'warn');
    } catch (e) { ctx.flash(`Publish failed: ${e.message}`, 'error'); }
  });
  return form;
}

// A binding's unbind button: DELETE by its properties key.
export function unbindButton(ctx, vhost, b, done) {
  if (b.source === '') return h('span', { class: 'muted' }, '(default exchange binding)');
  const kind = b.destination_type === 'queue' ? 'q' : 'e';
  return button('Unbind', async () => {
    try {
      await api('DELETE', `/api/bindings/${enc(vhost)}/e/${enc(b.source)}/${kind}/${enc(b.destination)}/${enc(b.properties_key)}`);
      ctx.flash('Binding removed.');
      done();
    } catch (e) { ctx.flash(`Unbind failed: ${e.message}`, 'error'); }
  });
}

export function queueView(ctx, vhost, name) {
  const depth = new Series(['ready', 'unacked']);
  const depthChart = chart(depth, { label: 'Queue depth' });
  const info = h('div', { id: 'queue-details' });
  const consumers = h('div', { id: 'queue-consumers' });
  const bindings = h('div', { id: 'queue-bindings' });
  const got = h('div', { id: 'got-messages' });
  const path = `/api/queues/${enc(vhost)}/${enc(name)}`;

  const bindSource = h('input', { name: 'source', required: true });
  const bindKey = h('input', { name: 'routing_key' });
  const bindArgs = h('textarea', { name: 'arguments', rows: 2 });
  const bindForm = h('form', { class: 'inline-form', id: 'bind-form' },
    field('From exchange', bindSource), field('Routing key', bindKey), field('Arguments (JSON)', bindArgs),
    h('button', { type: 'submit' }, 'Bind'));
  bindForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      await api('POST', `/api/bindings/${enc(vhost)}/e/${enc(bindSource.value)}/q/${enc(name)}`,
        { routing_key: bindKey.value, arguments: bindArgs.value.trim() ? JSON.parse(bindArgs.value) : {} });
      ctx.flash('Binding added.');
      refresh();
    } catch (e) { ctx.flash(`Bind failed: ${e.message}`, 'error'); }
  });

  const ackmode = select('ackmode', [
    ['ack_requeue_true', 'Nack message requeue true'], ['ack_requeue_false', 'Automatic ack'],
    ['reject_requeue_true', 'Reject requeue true'], ['reject_requeue_false', 'Reject requeue false'],
  ], 'ack_requeue_true');
  const encoding = select('encoding', [['auto', 'Auto string / base64'], ['base64', 'base64']], 'auto');
  const count = h('input', { name: 'count', type: 'number', min: 1, value: '1' });
  const getForm = h('form', { class: 'inline-form', id: 'get-form' },
    field('Ack mode', ackmode), field('Encoding', encoding), field('Messages', count),
    h('button', { type: 'submit' }, 'Get message(s)'));
  getForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    if (ackmode.value !== 'ack_requeue_true' && ackmode.value !== 'reject_requeue_true'
        && !confirm(`Get with "${ackmode.selectedOptions[0].textContent}" removes the messages from the queue. Continue?`)) return;
    try {
      const msgs = await api('POST', `${path}/get`, { count: Number(count.value), ackmode: ackmode.value, encoding: encoding.value, truncate: 50000 });
      fill(got, msgs.length ? msgs.map((m, i) => h('div', { class: 'message' },
        h('h3', null, `Message ${i + 1}`),
        details([
          ['Exchange', m.exchange === '' ? '(AMQP default)' : m.exchange], ['Routing key', m.routing_key],
          ['Redelivered', String(m.redelivered)], ['Remaining', m.message_count],
          ['Properties', pre(m.properties)], ['Payload', `${num(m.payload_bytes)} bytes, encoding: ${m.payload_encoding}`],
        ]), h('pre', { class: 'payload' }, m.payload))) : h('p', null, 'Queue is empty.'));
      refresh();
    } catch (e) { ctx.flash(`Get failed: ${e.message}`, 'error'); }
  });

  const actions = h('div', { class: 'actions' },
    button('Purge messages', async () => {
      if (!confirm(`Purge every message of queue "${name}"? They are lost.`)) return;
      try { await api('DELETE', `${path}/contents`); ctx.flash('Queue purged.'); refresh(); } catch (e) { ctx.flash(`Purge failed: ${e.message}`, 'error'); }
    }, 'danger'),
    button('Delete queue', async () => {
      if (!confirm(`Delete queue "${name}" and its messages?`)) return;
      try { await api('DELETE', path); ctx.flash(`Queue ${name} deleted.`); ctx.go('#/queues'); } catch (e) { ctx.flash(`Delete failed: ${e.message}`, 'error'); }
    }, 'danger'));

  const el = h('div', { id: 'queue' }, h('h1', null, 'Queue ', h('span', { class: 'name' }, name), h('small', null, ` in ${vhost}`)),
    section('Details', info),
    section('Depth', depthChart.el),
    section('Consumers', consumers),
    section('Bindings', bindings, bindForm),
    section('Publish message', publishForm(ctx, vhost, '', name)),
    section('Get messages', getForm, got),
    section('Purge or delete', actions));

  async function refresh() {
    const [q, bs] = await Promise.all([get(path), get(`${path}/bindings`)]);
    depth.add([q.messages_ready, q.messages_unacknowledged]);
    depthChart.draw();
    const cmq = q.cmq || {};
    fill(info, details([
      ['Virtual host', q.vhost], ['Type', q.type || 'classic'], ['Features', features(q) || '-'],
      ['State', q.state], ['Policy', q.policy || ''], ['Consumers', q.consumers],
      ['Ready', q.messages_ready], ['Unacked', q.messages_unacknowledged], ['Total', q.messages],
      ['Arguments', pre(q.arguments || {})],
      ['CMQ name', cmq.queueName], ['CMQ delayed', cmq.delayMsgNum], ['CMQ rewindable', cmq.rewindMsgNum],
      ['Incoming', rate((q.message_stats || {}).publish_details)],
      ['Deliver / get', rate((q.message_stats || {}).deliver_get_details)],
      ['Ack', rate((q.message_stats || {}).ack_details)],
    ]));
    fill(consumers, table([
      { key: 'tag', label: 'Consumer tag', value: (c) => c.consumer_tag },
      { key: 'channel', label: 'Channel', value: (c) => (c.channel_details || {}).name },
      { key: 'ack', label: 'Ack required', value: (c) => String(c.ack_required) },
      { key: 'exclusive', label: 'Exclusive', value: (c) => String(c.exclusive) },
      { key: 'prefetch_count', label: 'Prefetch', num: true },
      { key: 'arguments', label: 'Arguments', value: (c) => json(c.arguments || {}) },
    ], q.consumer_details || [], { empty: 'No consumers.' }));
    fill(bindings, table([
      { key: 'source', label: 'From', value: (b) => (b.source === '' ? '(AMQP default)' : h('a', { href: exchangeHref(vhost, b.source) }, b.source)) },
      { key: 'routing_key', label: 'Routing key' },
      { key: 'arguments', label: 'Arguments', value: (b) => json(b.arguments || {}) },
      { key: 'unbind', label: '', value: (b) => unbindButton(ctx, vhost, b, refresh) },
    ], bs, { empty: 'No bindings.', id: 'bindings-list' }));
  }
  return { el, refresh, title: `Queue ${name}` };
}
