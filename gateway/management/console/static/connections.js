// Connections and channels: lists, a connection's page, closing a connection (its own user or
// an administrator: the API decides).
import { api, get } from './api.js';
import { button, connectionHref, details, enc, fill, h, pre, section, table, when } from './dom.js';
import { fillPager, getPage, listToolbar, summaryText } from './pages.js';

const clientName = (c) => ((c.client_properties || {}).connection_name || (c.client_properties || {}).client_id || '');

// A list paged by the API, of the chosen vhost's (RabbitMQ's /api/vhosts/{vhost}/...) or of all.
function pagedList(ctx, { what, id, columns }) {
  const state = { page: 1, size: 100, filter: '', regex: true, sort: 'name', reverse: false };
  const list = h('div', { id: `${id}-table` });
  const pager = h('div', { class: 'pager' });
  const summary = h('p', { class: 'summary', id: `${id}-summary` });
  const toolbar = listToolbar(state, { id, changed: () => refresh() });
  function onSort(key) {
    if (state.sort === key) state.reverse = !state.reverse; else { state.sort = key; state.reverse = false; }
    refresh();
  }
  async function refresh() {
    const data = await getPage(ctx.vhost ? `/api/vhosts/${enc(ctx.vhost)}/${what}` : `/api/${what}`, state);
    fill(summary, summaryText(data, what));
    fill(list, table(columns.filter((c) => !(ctx.vhost && c.key === 'vhost')), data.items,
      { sort: state.sort, reverse: state.reverse, onSort, empty: `No ${what}.`, id: `${id}-list` }));
    fillPager(pager, state, data, refresh);
  }
  return { parts: [toolbar, summary, list, pager], refresh };
}

export function connectionsView(ctx) {
  const { parts, refresh } = pagedList(ctx, {
    what: 'connections',
    id: 'connections',
    columns: [
      { key: 'vhost', label: 'Virtual host', sort: 'vhost' },
      { key: 'name', label: 'Name', sort: 'name', value: (c) => h('a', { href: connectionHref(c.name) }, c.name) },
      { key: 'client', label: 'Client-provided name', value: clientName },
      { key: 'user', label: 'User name', sort: 'user' },
      { key: 'protocol', label: 'Protocol', sort: 'protocol' },
      { key: 'ssl', label: 'TLS', value: (c) => (c.ssl ? c.ssl_protocol || 'yes' : 'no') },
      { key: 'state', label: 'State', sort: 'state' },
      { key: 'channels', label: 'Channels', sort: 'channels', num: true },
      { key: 'connected_at', label: 'Connected at', sort: 'connected_at', value: (c) => when(c.connected_at) },
    ],
  });
  const el = h('div', { id: 'connections' }, h('h1', null, 'Connections'), ...parts);
  return { el, refresh, title: 'Connections' };
}

export function connectionView(ctx, name) {
  const path = `/api/connections/${enc(name)}`;
  const info = h('div', { id: 'connection-details' });
  const chans = h('div');
  const close = button('Force close', async () => {
    if (!confirm(`Close connection "${name}"?`)) return;
    try {
      await api('DELETE', path, undefined, { headers: { 'X-Reason': 'Closed via the management console' } });
      ctx.flash('Connection closed.');
      ctx.go('#/connections');
    } catch (e) { ctx.flash(`Close failed: ${e.message}`, 'error'); }
  }, 'danger');
  const el = h('div', { id: 'connection' }, h('h1', null, 'Connection ', h('span', { class: 'name' }, name)),
    section('Details', info), section('Channels', chans), section('Close this connection', close));
  async function refresh() {
    const [c, ch] = await Promise.all([get(path), get('/api/channels')]);
    fill(info, details([
      ['Client-provided name', clientName(c)], ['User', c.user], ['Virtual host', c.vhost], ['Protocol', c.protocol],
      ['State', c.state], ['Peer', `${c.peer_host}:${c.peer_port}`], ['Local', `${c.host}:${c.port}`],
      ['Authentication', c.auth_mechanism], ['Heartbeat', c.timeout], ['Frame max', c.frame_max],
      ['Channel max', c.channel_max], ['TLS', c.ssl ? `${c.ssl_protocol} ${c.ssl_cipher}` : 'no'],
      ['Connected at', when(c.connected_at)], ['Client properties', pre(c.client_properties || {})],
    ]));
    fill(chans, channelTable(ch.filter((x) => (x.connection_details || {}).name === name)));
  }
  return { el, refresh, title: `Connection ${name}` };
}

const channelHref = (name) => `#/channels/${enc(name)}`;

const CHANNEL_COLUMNS = [
  { key: 'name', label: 'Channel', sort: 'name', value: (c) => h('a', { href: channelHref(c.name) }, c.name) },
  { key: 'user', label: 'User name', sort: 'user' },
  { key: 'vhost', label: 'Virtual host', sort: 'vhost' },
  { key: 'mode', label: 'Mode', value: (c) => [c.confirm ? 'C' : '', c.transactional ? 'T' : ''].join(' ').trim() },
  { key: 'state', label: 'State', sort: 'state' },
  { key: 'prefetch_count', label: 'Prefetch', sort: 'prefetch_count', num: true },
  { key: 'messages_unacknowledged', label: 'Unacked', sort: 'messages_unacknowledged', num: true },
  { key: 'messages_unconfirmed', label: 'Unconfirmed', sort: 'messages_unconfirmed', num: true },
  { key: 'consumer_count', label: 'Consumers', sort: 'consumer_count', num: true },
];

function channelTable(items) {
  return table(CHANNEL_COLUMNS, items, { empty: 'No channels.', id: 'channels-list' });
}

export function channelsView(ctx) {
  const { parts, refresh } = pagedList(ctx, { what: 'channels', id: 'channels', columns: CHANNEL_COLUMNS });
  const el = h('div', { id: 'channels' }, h('h1', null, 'Channels'), ...parts);
  return { el, refresh, title: 'Channels' };
}

export function channelView(ctx, name) {
  const info = h('div', { id: 'channel-details' });
  const consumers = h('div', { id: 'channel-consumers' });
  const el = h('div', { id: 'channel' }, h('h1', null, 'Channel ', h('span', { class: 'name' }, name)),
    section('Details', info), section('Consumers', consumers));
  async function refresh() {
    const [chans, cons] = await Promise.all([get('/api/channels'), get('/api/consumers')]);
    const c = chans.find((x) => x.name === name);
    if (!c) { fill(info, h('p', { class: 'error' }, 'This channel is closed.')); fill(consumers); return; }
    const conn = (c.connection_details || {}).name;
    fill(info, details([
      ['Connection', h('a', { href: connectionHref(conn) }, conn)], ['Number', c.number], ['User', c.user],
      ['Virtual host', c.vhost], ['State', c.state], ['Confirm mode', String(c.confirm)], ['Transactional', String(c.transactional)],
      ['Prefetch (consumer / channel)', `${c.prefetch_count} / ${c.global_prefetch_count}`],
      ['Unacked', c.messages_unacknowledged], ['Unconfirmed', c.messages_unconfirmed],
      ['Uncommitted messages', c.messages_uncommitted], ['Uncommitted acks', c.acks_uncommitted],
    ]));
    fill(consumers, table([
      { key: 'consumer_tag', label: 'Consumer tag' },
      { key: 'queue', label: 'Queue', value: (k) => h('a', { href: `#/queues/${enc(k.queue.vhost)}/${enc(k.queue.name)}` }, k.queue.name) },
      { key: 'ack', label: 'Ack required', value: (k) => String(k.ack_required) },
      { key: 'prefetch_count', label: 'Prefetch', num: true },
    ], cons.filter((k) => (k.channel_details || {}).name === name), { empty: 'No consumers.', id: 'channel-consumers-list' }));
  }
  return { el, refresh, title: `Channel ${name}` };
}
