// Overview: totals, message rates over the last minutes, alarms, listeners, profile and store.
import { get } from './api.js';
import { Series, chart } from './chart.js';
import { bytes, details, fill, h, section, table } from './dom.js';

const LISTENER_NAMES = {
  amqp: 'AMQP', 'amqp/ssl': 'AMQPS', mqtt: 'MQTT', 'mqtt/ssl': 'MQTTS', http: 'Management API', https: 'Management API',
  'http/prometheus': 'Metrics', 'https/prometheus': 'Metrics', 'cmq-api': 'CMQ API', 'cmq-api/ssl': 'CMQ API',
};
// RabbitMQ's overview rates, under /api/overview's message_stats names.
const RATES = [['publish', 'publish'], ['confirm', 'confirm'], ['deliver_get', 'deliver / get'], ['ack', 'ack'],
  ['redeliver', 'redeliver']];
const rates = new Series(RATES.map(([, label]) => label));

export function overviewView(ctx) {
  const totals = h('div');
  const alarms = h('div');
  const listeners = h('div');
  const node = h('div');
  const rateChart = chart(rates, { label: 'Message rates', unit: '/s' });
  const el = h('div', { id: 'overview' }, h('h1', null, 'Overview'),
    section('Totals', totals),
    section('Message rates', rateChart.el),
    section('Alarms', alarms),
    section('Gateway', node),
    section('Listeners', listeners));
  async function refresh() {
    const o = await get('/api/overview');
    const ot = o.object_totals || {}; const qt = o.queue_totals || {}; const ms = o.message_stats || {};
    fill(totals, details([
      ['Connections', ot.connections], ['Channels', ot.channels], ['Exchanges', ot.exchanges],
      ['Queues', ot.queues], ['Consumers', ot.consumers], ['Messages ready', qt.messages_ready],
      ['Messages unacked', qt.messages_unacknowledged], ['Messages total', qt.messages],
    ]));
    const r = (k) => (ms[`${k}_details`] || {}).rate || 0;
    rates.add(RATES.map(([k]) => r(k)));
    rateChart.draw();
    const inEffect = o.alarms || [];
    fill(alarms, details([
      ['Memory', `${o.mem_alarm ? 'ALARM' : 'ok'} (${bytes(o.mem_used)} of ${bytes(o.mem_limit)})`],
      ['Disk', `${o.disk_free_alarm ? 'ALARM' : 'ok'} (${typeof o.disk_free === 'number' ? `${bytes(o.disk_free)} free` : 'free space not measured: no data dir'}, limit ${bytes(o.disk_free_limit)})`],
      ['In effect', inEffect.length ? inEffect.map(String).join(', ') : 'none'],
      o.store_failed ? ['Store', 'FAILED: read-only'] : null,
    ]));
    const profiles = Object.entries(o.cmq_vhost_profiles || {}).filter(([, p]) => p !== o.cmq_profile);
    fill(node, details([
      ['Product', `${o.product_name} ${o.product_version}`],
      ['Cluster', o.cluster_name], ['Node', o.node],
      ['Profile', o.cmq_profile],
      profiles.length ? ['Vhosts with another profile', profiles.map(([v, p]) => `${v}: ${p}`).join(', ')] : null,
      ['Store', o.cmq_store === 'jetstream' ? 'NATS JetStream (shared)' : o.cmq_store === 'embedded' ? 'embedded (data dir)' : o.cmq_store],
      ['Memory held', bytes(o.mem_used)], ['Resident set', bytes(o.mem_rss)],
    ]));
    fill(listeners, table([
      { key: 'protocol', label: 'Protocol', value: (l) => `${LISTENER_NAMES[l.protocol] || l.protocol} (${l.protocol})` },
      { key: 'ip_address', label: 'Bound to' },
      { key: 'port', label: 'Port', value: (l) => String(l.port) },
    ], o.listeners || [], { empty: 'No listeners reported.' }));
  }
  return { el, refresh, title: 'Overview' };
}
