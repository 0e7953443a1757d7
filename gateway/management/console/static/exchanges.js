// Exchanges: the list (paged by the API) and an exchange's page.
import { api, get } from './api.js';
import {
  button, details, enc, features, exchangeHref, field, fill, h, json, pre, queueHref, rate, section, select, table,
} from './dom.js';
import { fillPager, getPage, listToolbar, summaryText } from './pages.js';
import { publishForm, unbindButton } from './queues.js';

const label = (name) => (name === '' ? '(AMQP default)' : name);


export function exchangesView(ctx) {
  const state = { page: 1, size: 100, filter: '', regex: true, sort: 'name', reverse: false };
  const list = h('div', { id: 'exchanges-table' });
  const pager = h('div', { class: 'pager' });
  const summary = h('p', { class: 'summary', id: 'exchanges-summary' });
  const toolbar = listToolbar(state, { id: 'exchange', changed: () => refresh() });
  const name = h('input', { name: 'name', required: true });
  const vhost = h('input', { name: 'vhost', value: ctx.vhost || '/' });
  const type = select('type', ['direct', 'fanout', 'topic', 'headers'], 'direct');
  const durable = select('durable', [['true', 'Durable'], ['false', 'Transient']], 'true');
  const form = h('form', { class: 'inline-form', id: 'add-exchange' },
    field('Virtual host', vhost), field('Name', name), field('Type', type), field('Durability', durable),
    h('button', { type: 'submit' }, 'Add exchange'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      await api('PUT', `/api/exchanges/${enc(vhost.value)}/${enc(name.value)}`, { type: type.value, durable: durable.value === 'true' });
      ctx.flash(`Exchange ${name.value} declared.`);
      name.value = '';
      refresh();
    } catch (e) { ctx.flash(e.message, 'error'); }
  });
  const el = h('div', { id: 'exchanges' }, h('h1', null, 'Exchanges'),
    toolbar, summary, list, pager, section('Add a new exchange', form));
  const columns = [
    ctx.vhost ? null : { key: 'vhost', label: 'Virtual host', sort: 'vhost' },
    { key: 'name', label: 'Name', sort: 'name', value: (x) => h('a', { href: exchangeHref(x.vhost, x.name) }, label(x.name)) },
    { key: 'type', label: 'Type', sort: 'type' },
    { key: 'features', label: 'Features', value: features },
    { key: 'topic', label: 'CMQ topic', value: (x) => (x.cmq ? x.cmq.topicName : '') },
    { key: 'in', label: 'Message rate in', num: true, value: (x) => rate((x.message_stats || {}).publish_in_details) },
    { key: 'out', label: 'Message rate out', num: true, value: (x) => rate((x.message_stats || {}).publish_out_details) },
  ].filter(Boolean);
  function onSort(key) {
    if (state.sort === key) state.reverse = !state.reverse; else { state.sort = key; state.reverse = false; }
    refresh();
  }
  async function refresh() {
    const data = await getPage(ctx.vhost ? `/api/exchanges/${enc(ctx.vhost)}` : '/api/exchanges', state);
    fill(summary, summaryText(data, 'exchanges'));
    fill(list, table(columns, data.items, { sort: state.sort, reverse: state.reverse, onSort, empty: 'No exchanges.', id: 'exchanges-list' }));
    fillPager(pager, state, data, refresh);
  }
  return { el, refresh, title: 'Exchanges' };
}

export function exchangeView(ctx, vhost, name) {
  const real = name === 'amq.default' ? '' : name;
  const path = `/api/exchanges/${enc(vhost)}/${enc(name)}`;
  const info = h('div', { id: 'exchange-details' });
  const out = h('div', { id: 'exchange-bindings-out' });
  const inb = h('div', { id: 'exchange-bindings-in' });
  const dest = h('input', { name: 'destination', required: true });
  const kind = select('kind', [['q', 'To queue'], ['e', 'To exchange']], 'q');
  const key = h('input', { name: 'routing_key' });
  const bindForm = h('form', { class: 'inline-form', id: 'exchange-bind-form' },
    field('Destination', kind), field('Name', dest), field('Routing key', key), h('button', { type: 'submit' }, 'Bind'));
  bindForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      await api('POST', `/api/bindings/${enc(vhost)}/e/${enc(name)}/${kind.value}/${enc(dest.value)}`, { routing_key: key.value, arguments: {} });
      ctx.flash('Binding added.');
      refresh();
    } catch (e) { ctx.flash(`Bind failed: ${e.message}`, 'error'); }
  });
  const del = button('Delete this exchange', async () => {
    if (!confirm(`Delete exchange "${name}" and its bindings?`)) return;
    try { await api('DELETE', path); ctx.flash(`Exchange ${name} deleted.`); ctx.go('#/exchanges'); } catch (e) { ctx.flash(`Delete failed: ${e.message}`, 'error'); }
  }, 'danger');
  const el = h('div', { id: 'exchange' }, h('h1', null, 'Exchange ', h('span', { class: 'name' }, label(real)), h('small', null, ` in ${vhost}`)),
    section('Details', info),
    section('Bindings from this exchange', out, real === '' ? null : bindForm),
    section('Bindings to this exchange', inb),
    section('Publish message', publishForm(ctx, vhost, name)),
    real === '' || real.startsWith('amq.') ? null : section('Delete', del));
  const destLink = (b) => (b.destination_type === 'queue' ? h('a', { href: queueHref(vhost, b.destination) }, b.destination)
    : h('a', { href: exchangeHref(vhost, b.destination) }, b.destination));
  async function refresh() {
    const [x, src, dst] = await Promise.all([get(path), get(`${path}/bindings/source`), get(`${path}/bindings/destination`)]);
    const ms = x.message_stats || {};
    fill(info, details([
      ['Type', x.type], ['Features', features(x) || '-'], ['Policy', x.policy || ''],
      ['Arguments', pre(x.arguments || {})],
      ['Message rate in', rate(ms.publish_in_details)], ['Message rate out', rate(ms.publish_out_details)],
      x.cmq ? ['CMQ topic', x.cmq.topicName] : null, x.cmq ? ['CMQ filter type', x.cmq.filterType] : null,
      x.cmq ? ['CMQ subscriptions', x.cmq.subscriptionCount] : null, x.cmq ? ['CMQ retained messages', x.cmq.msgCount] : null,
    ]));
    fill(out, table([
      { key: 'destination', label: 'To', value: destLink },
      { key: 'destination_type', label: 'Kind' },
      { key: 'routing_key', label: 'Routing key' },
      { key: 'arguments', label: 'Arguments', value: (b) => json(b.arguments || {}) },
      { key: 'unbind', label: '', value: (b) => unbindButton(ctx, vhost, b, refresh) },
    ], real === '' ? src.slice(0, 200) : src, { empty: 'No bindings.' }));
    fill(inb, table([
      { key: 'source', label: 'From', value: (b) => h('a', { href: exchangeHref(vhost, b.source) }, label(b.source)) },
      { key: 'routing_key', label: 'Routing key' },
      { key: 'unbind', label: '', value: (b) => unbindButton(ctx, vhost, b, refresh) },
    ], dst, { empty: 'No bindings.' }));
  }
  return { el, refresh, title: `Exchange ${label(real)}` };
}
