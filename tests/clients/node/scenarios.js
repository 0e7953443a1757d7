// amqplib (Node.js) through its documented promise API, one scenario per output line:
// "<scenario>\t<outcome>". The outcome is plain text made only of what the broker answered, so
// that the run against RabbitMQ and the run against the gateway compare line by line
// (tests/integration/test_clients_node.py).
//
//   node scenarios.js URL PREFIX
'use strict';

const amqp = require('amqplib');

const HANG_MS = 15000; // hang protection only; a pass never waits for it

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitFor(cond) {
  const deadline = Date.now() + HANG_MS;
  while (!cond() && Date.now() < deadline) await sleep(10);
}

// A value with its type, keys sorted, so that an int that came back a float shows.
function typed(v) {
  if (v === null || v === undefined) return String(v);
  if (Buffer.isBuffer(v)) return `buf:${v.toString('hex')}`;
  if (Array.isArray(v)) return `[${v.map(typed).join(',')}]`;
  if (typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${k}=${typed(v[k])}`).join(',')}}`;
  }
  return `${typeof v}:${v}`;
}

function props(p) {
  const headers = Object.assign({}, p.headers || {});
  for (const k of Object.keys(headers)) if (k.startsWith('x-cmq-')) delete headers[k]; // M11
  const id = typeof p.messageId === 'string' && p.messageId.startsWith('msg-') ? undefined : p.messageId;
  return [
    `ct=${p.contentType}`, `ce=${p.contentEncoding}`, `dm=${p.deliveryMode}`, `pr=${p.priority}`,
    `corr=${p.correlationId}`, `reply=${p.replyTo}`, `exp=${p.expiration}`, `id=${id}`, `ts=${p.timestamp}`,
    `type=${p.type}`, `user=${p.userId}`, `app=${p.appId}`, `cluster=${p.clusterId}`,
    `headers=${Object.keys(headers).length ? typed(headers) : 'none'}`,
  ].join(' ');
}

// The reply code and the class of the reply text of a channel or connection close.
function fault(err) {
  if (err && err.code) return `${err.code} ${String(err.message).replace(/^.*with message "/, '').split(' - ')[0]}`;
  return `unexpected ${err}`;
}

async function expectFault(conn, action) {
  const ch = await conn.createChannel();
  ch.on('error', () => {}); // the close is what the scenario reads
  try {
    await action(ch);
    return 'accepted';
  } catch (err) {
    return fault(err);
  }
}

async function withConnection(url, body) {
  const conn = await amqp.connect(url);
  conn.on('error', () => {});
  try {
    return await body(conn);
  } finally {
    try { await conn.close(); } catch (_) { /* closed by the broker */ }
  }
}

const scenarios = {
  async properties(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createChannel();
      await ch.assertQueue(q, { durable: false });
      const headers = {
        str: 'text ü', int: 7, neg: -3, big: 2 ** 40, float: 2.5, true: true, false: false, none: null,
        bytes: Buffer.from([0, 255]), list: [1, 'two', false], table: { a: 1, b: ['x', 2] },
        dec: { '!': 'decimal', value: { places: 2, digits: 314 } },
        when: { '!': 'timestamp', value: 1700000000 },
      };
      ch.sendToQueue(q, Buffer.from('payload'), {
        contentType: 'application/json', contentEncoding: 'gzip', headers, deliveryMode: 2, priority: 5,
        correlationId: 'corr-1', replyTo: 'replies', expiration: '60000', messageId: 'my-id-1',
        timestamp: 1700000000, type: 'order.created', userId: 'guest', appId: 'tests', clusterId: 'c1',
      });
      ch.sendToQueue(q, Buffer.alloc(0));
      const a = await ch.get(q, { noAck: true });
      const b = await ch.get(q, { noAck: true });
      const none = await ch.get(q, { noAck: true });
      await ch.deleteQueue(q);
      return `${a.content} ${props(a.properties)} | ${b.content.length} ${props(b.properties)} | ${none}`;
    });
  },

  async confirms_and_return(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createConfirmChannel();
      const returned = [];
      ch.on('return', (m) => returned.push(`${m.fields.replyCode} ${m.fields.replyText} ${m.fields.exchange} ` +
                                           `${m.fields.routingKey} ${m.content}`));
      await ch.assertQueue(q, { durable: true });
      await ch.assertExchange(q, 'direct', { durable: false });
      const acks = [];
      for (let i = 0; i < 50; i++) {
        ch.sendToQueue(q, Buffer.from(`m${i}`), { persistent: true, mandatory: true },
          (err) => acks.push(err ? 'nack' : 'ack'));
      }
      ch.publish(q, 'nowhere', Buffer.from('lost'), { mandatory: true });
      await ch.waitForConfirms();
      await waitFor(() => returned.length > 0);
      const { messageCount } = await ch.checkQueue(q);
      await ch.deleteQueue(q);
      await ch.deleteExchange(q);
      return `returned=${returned} acked=${acks.filter((a) => a === 'ack').length} count=${messageCount}`;
    });
  },

  async prefetch(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createChannel();
      await ch.assertQueue(q, { durable: false });
      for (let i = 0; i < 5; i++) ch.sendToQueue(q, Buffer.from(String(i)));
      await ch.prefetch(2);
      const got = [];
      await ch.consume(q, (m) => got.push(m), { noAck: false });
      await waitFor(() => got.length >= 2);
      await sleep(300); // anything beyond the prefetch would arrive now
      const first = got.map((m) => `${m.fields.deliveryTag}:${m.content}`).join(',');
      ch.ack(got[got.length - 1], true);
      await waitFor(() => got.length >= 4);
      await sleep(300);
      const second = got.map((m) => `${m.fields.deliveryTag}:${m.content}`).join(',');
      await ch.deleteQueue(q);
      return `${first} ${second}`;
    });
  },

  async nack_reject(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createChannel();
      await ch.assertQueue(q, { durable: false });
      for (const b of ['a', 'b', 'c']) ch.sendToQueue(q, Buffer.from(b));
      const steps = [];
      let m = await ch.get(q);
      steps.push(`${m.content}${m.fields.redelivered}`);
      ch.nack(m, false, true);
      m = await ch.get(q);
      steps.push(`${m.content}${m.fields.redelivered} left=${m.fields.messageCount}`);
      ch.reject(m, false);
      m = await ch.get(q);
      steps.push(`${m.content}${m.fields.redelivered}`);
      ch.reject(m, true);
      m = await ch.get(q);
      steps.push(`${m.content}${m.fields.redelivered}`);
      ch.nack(m, false, false);
      m = await ch.get(q);
      steps.push(`${m.content}${m.fields.redelivered}`);
      ch.ack(m);
      steps.push(String(await ch.get(q)));
      await ch.deleteQueue(q);
      return steps.join(',');
    });
  },

  async faults(url, q) {
    const out = {};
    await withConnection(url, async (conn) => {
      out['passive missing queue'] = await expectFault(conn, (ch) => ch.checkQueue(`${q}nope`));
      out['passive missing exchange'] = await expectFault(conn, (ch) => ch.checkExchange(`${q}nope`));
      out['publish to missing exchange'] = await expectFault(conn, async (ch) => {
        ch.publish(`${q}nope`, 'k', Buffer.from('x'));
        await ch.assertQueue('', { exclusive: true }); // a round trip: the close comes first
      });
      const ch = await conn.createChannel();
      await ch.assertQueue(q, { durable: false });
      out['redeclare with other durable'] = await expectFault(conn, (c) => c.assertQueue(q, { durable: true }));
      out['redeclare with other arguments'] = await expectFault(conn,
        (c) => c.assertQueue(q, { durable: false, messageTtl: 1000 }));
      await ch.assertExchange(q, 'fanout', { durable: false });
      out['redeclare exchange other type'] = await expectFault(conn,
        (c) => c.assertExchange(q, 'topic', { durable: false }));
      out['consume missing queue'] = await expectFault(conn, (c) => c.consume(`${q}nope`, () => {}));
      out['unknown delivery tag'] = await expectFault(conn, async (c) => {
        c.ack({ fields: { deliveryTag: 99 } });
        await c.checkQueue(q);
      });
      await ch.assertQueue(`${q}excl`, { exclusive: true });
      await withConnection(url, async (other) => {
        out['exclusive elsewhere'] = await expectFault(other, (c) => c.checkQueue(`${q}excl`));
      });
      out['bind missing exchange'] = await expectFault(conn, (c) => c.bindQueue(q, `${q}nope`, 'k'));
      out['declare amq. name'] = await expectFault(conn, (c) => c.assertExchange('amq.nope', 'direct'));
      out['delete amq.direct'] = await expectFault(conn, (c) => c.deleteExchange('amq.direct'));
      await ch.deleteQueue(q);
      await ch.deleteExchange(q);
    });
    const conn = await amqp.connect(url);
    const closed = new Promise((resolve) => conn.on('close', (err) => resolve(err ? fault(err) : 'clean')));
    conn.on('error', () => {});
    out['unknown exchange type'] = await expectFault(conn, (c) => c.assertExchange(q, 'nope-type'));
    out['connection closed with'] = await closed;
    return Object.entries(out).map(([k, v]) => `${k}=${v}`).join(', ');
  },

  async counts_and_names(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createChannel();
      const ok = await ch.assertQueue(q, { durable: false });
      for (let i = 0; i < 3; i++) ch.sendToQueue(q, Buffer.from('x'));
      const purged = (await ch.purgeQueue(q)).messageCount;
      ch.sendToQueue(q, Buffer.from('y'));
      const { consumerCount } = await ch.checkQueue(q);
      const deleted = (await ch.deleteQueue(q)).messageCount;
      const gen = (await ch.assertQueue('', { exclusive: true })).queue;
      return `declared=${ok.queue === q} purged=${purged} consumers=${consumerCount} deleted=${deleted} ` +
             `generated=${gen.startsWith('amq.gen-')}`;
    });
  },

  async cancel_on_delete(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createChannel();
      await ch.assertQueue(q, { durable: false });
      const events = [];
      const { consumerTag } = await ch.consume(q, (m) => events.push(m === null ? 'cancelled' : 'message'),
        { consumerTag: 'my-tag', noAck: true });
      const other = await conn.createChannel();
      await other.deleteQueue(q);
      await waitFor(() => events.length > 0);
      await sleep(200);
      const open = await ch.checkExchange('amq.direct').then(() => true, () => false);
      return `tag=${consumerTag} events=${events} channel open=${open}`;
    });
  },

  async direct_reply_to(url, q) {
    return withConnection(url, async (conn) => {
      const server = await conn.createChannel();
      await server.assertQueue(q, { durable: false });
      await server.consume(q, (m) => {
        server.sendToQueue(m.properties.replyTo, Buffer.from(`re:${m.content}`),
          { correlationId: m.properties.correlationId });
      }, { noAck: true });
      const client = await conn.createChannel();
      const replies = [];
      await client.consume('amq.rabbitmq.reply-to', (m) => replies.push(`${m.properties.correlationId}:${m.content}`),
        { noAck: true });
      client.sendToQueue(q, Buffer.from('one'), { replyTo: 'amq.rabbitmq.reply-to', correlationId: '1' });
      client.sendToQueue(q, Buffer.from('two'), { replyTo: 'amq.rabbitmq.reply-to', correlationId: '2' });
      await waitFor(() => replies.length >= 2);
      await server.deleteQueue(q);
      return replies.join(' ');
    });
  },

  async dead_letter_and_ttl(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createChannel();
      await ch.assertExchange(`${q}.dlx`, 'fanout', { durable: false });
      await ch.assertQueue(`${q}.dead`, { durable: false });
      await ch.bindQueue(`${q}.dead`, `${q}.dlx`, '');
      await ch.assertQueue(q, { durable: false, deadLetterExchange: `${q}.dlx`, messageTtl: 100 });
      ch.sendToQueue(q, Buffer.from('expires'));
      ch.sendToQueue(q, Buffer.from('at once'), { expiration: '0' });
      const dead = [];
      const deadline = Date.now() + HANG_MS;
      while (dead.length < 2 && Date.now() < deadline) {
        const m = await ch.get(`${q}.dead`, { noAck: true });
        if (!m) { await sleep(20); continue; }
        const death = (m.properties.headers || {})['x-death'];
        dead.push(`${m.content}/${death && death[0] ? death[0].reason : 'none'}`);
      }
      const { messageCount } = await ch.checkQueue(q);
      await ch.deleteQueue(q);
      await ch.deleteQueue(`${q}.dead`);
      await ch.deleteExchange(`${q}.dlx`);
      return `dead=${dead.sort()} left=${messageCount}`;
    });
  },

  async max_length_reject_publish(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createConfirmChannel();
      await ch.assertQueue(q, { durable: false, maxLength: 2, arguments: { 'x-overflow': 'reject-publish' } });
      const outcomes = [];
      for (let i = 0; i < 4; i++) {
        ch.sendToQueue(q, Buffer.from(`m${i}`), {}, (err) => outcomes.push(`${i}:${err ? 'nack' : 'ack'}`));
      }
      const all = await ch.waitForConfirms().then(() => 'all acked', () => 'some nacked');
      const { messageCount } = await ch.checkQueue(q);
      await ch.deleteQueue(q);
      return `${all} ${outcomes.sort()} count=${messageCount}`;
    });
  },

  async alternate_and_exchange_bindings(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createChannel();
      await ch.assertExchange(`${q}.ae`, 'fanout', { durable: false });
      await ch.assertQueue(`${q}.unrouted`, { durable: false });
      await ch.bindQueue(`${q}.unrouted`, `${q}.ae`, '');
      await ch.assertExchange(`${q}.main`, 'direct', { durable: false, alternateExchange: `${q}.ae` });
      await ch.assertExchange(`${q}.inner`, 'topic', { durable: false });
      await ch.bindExchange(`${q}.inner`, `${q}.main`, 'k');
      await ch.assertQueue(`${q}.bound`, { durable: false });
      await ch.bindQueue(`${q}.bound`, `${q}.inner`, '#');
      ch.publish(`${q}.main`, 'k', Buffer.from('via e2e'));
      ch.publish(`${q}.main`, 'other', Buffer.from('to ae'));
      const bound = await ch.get(`${q}.bound`, { noAck: true });
      const unrouted = await ch.get(`${q}.unrouted`, { noAck: true });
      await ch.unbindExchange(`${q}.inner`, `${q}.main`, 'k');
      ch.publish(`${q}.main`, 'k', Buffer.from('after unbind'));
      const later = await ch.get(`${q}.unrouted`, { noAck: true });
      for (const x of ['.main', '.inner', '.ae']) await ch.deleteExchange(q + x);
      await ch.deleteQueue(`${q}.bound`);
      await ch.deleteQueue(`${q}.unrouted`);
      return [bound, unrouted, later].map((m) => (m ? String(m.content) : 'none')).join(' ');
    });
  },

  async big_message_and_recover(url, q) {
    return withConnection(url, async (conn) => {
      const ch = await conn.createChannel();
      await ch.assertQueue(q, { durable: false });
      const big = Buffer.alloc(1 << 20);
      for (let i = 0; i < big.length; i++) big[i] = (i * 31) & 0xff;
      ch.sendToQueue(q, big);
      const m = await ch.get(q);
      const same = m && big.equals(m.content);
      await ch.recover();
      const again = await ch.get(q, { noAck: true });
      await ch.deleteQueue(q);
      return `same=${same} recovered=${!!again && big.equals(again.content)} ` +
             `redelivered=${!!again && again.fields.redelivered}`;
    });
  },
};

async function main() {
  const [url, prefix] = process.argv.slice(2);
  for (const [name, run] of Object.entries(scenarios)) {
    let outcome;
    try {
      outcome = await run(url, `${prefix}-${name.replace(/_/g, '')}`);
    } catch (err) {
      outcome = `FAILED ${err && err.stack ? err.stack : err}`;
    }
    process.stdout.write(`${name}\t${String(outcome).replace(/\n/g, ' ')}\n`);
  }
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
