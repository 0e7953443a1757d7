// The RabbitMQ Java client (com.rabbitmq:amqp-client, Debian's librabbitmq-client-java) through
// its documented API, one scenario per output line: "<scenario>\t<outcome>". The outcome is
// plain text made only of what the broker answered, so that the run against RabbitMQ and the run
// against the gateway compare line by line (tests/integration/test_clients_java.py).
//
// Run as a single-file program (Java 11+): java -cp amqp-client.jar:slf4j-api.jar Scenarios.java URI PREFIX
import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.LongString;
import com.rabbitmq.client.ShutdownSignalException;

import java.io.IOException;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Date;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BooleanSupplier;

public class Scenarios {
    static final long HANG_MS = 15_000;  // hang protection only; a pass never waits for it

    interface Step { Object run() throws Exception; }

    static Connection connect(String uri) throws Exception {
        ConnectionFactory f = new ConnectionFactory();
        f.setUri(uri);
        f.setAutomaticRecoveryEnabled(false);  // a channel error must surface, not be retried
        return f.newConnection();
    }

    static byte[] utf8(String s) { return s.getBytes(StandardCharsets.UTF_8); }
    static String text(byte[] b) { return b == null ? "null" : new String(b, StandardCharsets.UTF_8); }

    /** The reply code and the class of reply text ("NOT_FOUND - no queue ..." -> "404 NOT_FOUND"). */
    static String fault(Throwable e) {
        Throwable t = e;
        while (t != null && !(t instanceof ShutdownSignalException)) t = t.getCause();
        if (t == null) return "unexpected " + e;
        ShutdownSignalException s = (ShutdownSignalException) t;
        Object reason = s.getReason();
        String scope = s.isHardError() ? "connection" : "channel";
        if (reason instanceof AMQP.Channel.Close) {
            AMQP.Channel.Close c = (AMQP.Channel.Close) reason;
            return scope + " " + c.getReplyCode() + " " + c.getReplyText().split(" - ")[0];
        }
        if (reason instanceof AMQP.Connection.Close) {
            AMQP.Connection.Close c = (AMQP.Connection.Close) reason;
            return scope + " " + c.getReplyCode() + " " + c.getReplyText().split(" - ")[0];
        }
        return scope + " " + reason;
    }

    static String expectFault(Step step) {
        try {
            step.run();
            return "accepted";
        } catch (Exception e) {
            return fault(e);
        }
    }

    static void waitFor(Connection conn, BooleanSupplier cond) throws InterruptedException {
        long deadline = System.currentTimeMillis() + HANG_MS;
        while (!cond.getAsBoolean() && System.currentTimeMillis() < deadline) Thread.sleep(10);
    }

    /** A header value with its Java type, so that an int that came back a long shows. */
    static String typed(Object v) {
        if (v == null) return "null";
        if (v instanceof LongString) return "S:" + v;
        if (v instanceof byte[]) return "bytes:" + Arrays.toString((byte[]) v);
        if (v instanceof Map) {
            StringBuilder b = new StringBuilder("{");
            for (Map.Entry<?, ?> e : new TreeMap<>((Map<?, ?>) v).entrySet())
                b.append(e.getKey()).append('=').append(typed(e.getValue())).append(',');
            return b.append('}').toString();
        }
        if (v instanceof List) {
            StringBuilder b = new StringBuilder("[");
            for (Object o : (List<?>) v) b.append(typed(o)).append(',');
            return b.append(']').toString();
        }
        if (v instanceof Date) return "Date:" + ((Date) v).getTime();
        return v.getClass().getSimpleName() + ":" + v;
    }

    static String props(AMQP.BasicProperties p) {
        Map<String, Object> headers = p.getHeaders() == null ? null : new HashMap<>(p.getHeaders());
        if (headers != null) headers.keySet().removeIf(k -> k.startsWith("x-cmq-"));  // M11
        String id = p.getMessageId();
        if (id != null && id.startsWith("msg-")) id = null;  // M11: the gateway's CMQ message ID
        return "ct=" + p.getContentType() + " ce=" + p.getContentEncoding() + " dm=" + p.getDeliveryMode()
            + " pr=" + p.getPriority() + " corr=" + p.getCorrelationId() + " reply=" + p.getReplyTo()
            + " exp=" + p.getExpiration() + " id=" + id + " ts=" + (p.getTimestamp() == null ? null : p.getTimestamp().getTime())
            + " type=" + p.getType() + " user=" + p.getUserId() + " app=" + p.getAppId() + " cluster=" + p.getClusterId()
            + " headers=" + (headers == null || headers.isEmpty() ? "null" : typed(headers));
    }

    static String properties(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            ch.queueDeclare(q, false, false, false, null);
            Map<String, Object> h = new LinkedHashMap<>();
            h.put("str", "text ü");
            h.put("int", 7);
            h.put("long", 1L << 40);
            h.put("short", (short) -3);
            h.put("byte", (byte) 5);
            h.put("bool", true);
            h.put("double", 2.5d);
            h.put("float", 1.5f);
            h.put("dec", new BigDecimal("3.14"));
            h.put("date", new Date(1_700_000_000_000L));
            h.put("bytes", new byte[] {0, (byte) 0xff});
            h.put("none", null);
            Map<String, Object> inner = new HashMap<>();
            inner.put("a", 1);
            h.put("table", inner);
            h.put("list", new ArrayList<Object>(Arrays.asList(1, "two", false)));
            AMQP.BasicProperties p = new AMQP.BasicProperties.Builder()
                .contentType("application/json").contentEncoding("gzip").headers(h).deliveryMode(2).priority(5)
                .correlationId("corr-1").replyTo("replies").expiration("60000").messageId("my-id-1")
                .timestamp(new Date(1_700_000_000_000L)).type("order.created").userId("guest").appId("tests")
                .clusterId("c1").build();
            ch.basicPublish("", q, p, utf8("payload"));
            ch.basicPublish("", q, null, new byte[0]);
            GetResponse a = ch.basicGet(q, true), b = ch.basicGet(q, true), none = ch.basicGet(q, true);
            ch.queueDelete(q);
            return text(a.getBody()) + " " + props(a.getProps()) + " | " + b.getBody().length + " "
                + props(b.getProps()) + " | " + (none == null ? "empty" : "more");
        }
    }

    static String confirmsAndReturn(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            List<String> returned = new CopyOnWriteArrayList<>();
            ch.addReturnListener((code, replyText, exchange, key, p, body) ->
                returned.add(code + " " + replyText + " " + exchange + " " + key + " " + text(body)));
            ch.confirmSelect();
            ch.queueDeclare(q, true, false, false, null);
            ch.exchangeDeclare(q, "direct");
            AMQP.BasicProperties persistent = new AMQP.BasicProperties.Builder().deliveryMode(2).build();
            for (int i = 0; i < 50; i++) ch.basicPublish("", q, true, persistent, utf8("m" + i));
            ch.basicPublish(q, "nowhere", true, null, utf8("lost"));
            ch.waitForConfirmsOrDie(HANG_MS);
            waitFor(c, () -> !returned.isEmpty());
            long count = ch.queueDeclarePassive(q).getMessageCount();
            ch.queueDelete(q);
            ch.exchangeDelete(q);
            return "returned=" + returned + " count=" + count + " next=" + ch.getNextPublishSeqNo();
        }
    }

    static String prefetch(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            ch.queueDeclare(q, false, false, false, null);
            for (int i = 0; i < 5; i++) ch.basicPublish("", q, null, utf8(String.valueOf(i)));
            ch.basicQos(2);
            List<String> got = new CopyOnWriteArrayList<>();
            List<Long> tags = new CopyOnWriteArrayList<>();
            ch.basicConsume(q, false, new DefaultConsumer(ch) {
                @Override
                public void handleDelivery(String tag, Envelope env, AMQP.BasicProperties p, byte[] body) {
                    got.add(env.getDeliveryTag() + ":" + text(body));
                    tags.add(env.getDeliveryTag());
                }
            });
            waitFor(c, () -> got.size() >= 2);
            Thread.sleep(300);  // anything beyond the prefetch would arrive now
            String first = got.toString();
            ch.basicAck(tags.get(tags.size() - 1), true);
            waitFor(c, () -> got.size() >= 4);
            Thread.sleep(300);
            String second = got.toString();
            ch.queueDelete(q);
            return first + " " + second;
        }
    }

    static String nackReject(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            ch.queueDeclare(q, false, false, false, null);
            for (String b : new String[] {"a", "b", "c"}) ch.basicPublish("", q, null, utf8(b));
            List<String> steps = new ArrayList<>();
            GetResponse m = ch.basicGet(q, false);
            steps.add(text(m.getBody()) + m.getEnvelope().isRedeliver());
            ch.basicNack(m.getEnvelope().getDeliveryTag(), false, true);
            m = ch.basicGet(q, false);
            steps.add(text(m.getBody()) + m.getEnvelope().isRedeliver() + " left=" + m.getMessageCount());
            ch.basicReject(m.getEnvelope().getDeliveryTag(), false);
            m = ch.basicGet(q, false);
            steps.add(text(m.getBody()) + m.getEnvelope().isRedeliver());
            ch.basicReject(m.getEnvelope().getDeliveryTag(), true);
            m = ch.basicGet(q, false);
            steps.add(text(m.getBody()) + m.getEnvelope().isRedeliver());
            ch.basicNack(m.getEnvelope().getDeliveryTag(), false, false);
            m = ch.basicGet(q, false);
            steps.add(text(m.getBody()) + m.getEnvelope().isRedeliver());
            ch.basicAck(m.getEnvelope().getDeliveryTag(), false);
            steps.add(String.valueOf(ch.basicGet(q, false)));
            ch.queueDelete(q);
            return steps.toString();
        }
    }

    static String faults(String uri, String q) throws Exception {
        Map<String, String> out = new LinkedHashMap<>();
        try (Connection c = connect(uri)) {
            out.put("passive missing queue", expectFault(() -> c.createChannel().queueDeclarePassive(q + "nope")));
            out.put("passive missing exchange", expectFault(() -> c.createChannel().exchangeDeclarePassive(q + "nope")));
            out.put("publish to missing exchange", expectFault(() -> {
                Channel ch = c.createChannel();
                ch.basicPublish(q + "nope", "k", null, utf8("x"));
                return ch.queueDeclare();  // a round trip: the close comes first
            }));
            Channel ch = c.createChannel();
            ch.queueDeclare(q, false, false, false, null);
            out.put("redeclare with other durable", expectFault(() -> c.createChannel().queueDeclare(q, true, false, false, null)));
            Map<String, Object> ttl = new HashMap<>();
            ttl.put("x-message-ttl", 1000);
            out.put("redeclare with other arguments", expectFault(() -> c.createChannel().queueDeclare(q, false, false, false, ttl)));
            c.createChannel().exchangeDeclare(q, "fanout");
            out.put("redeclare exchange other type", expectFault(() -> c.createChannel().exchangeDeclare(q, "topic")));
            out.put("consume missing queue", expectFault(() -> c.createChannel().basicConsume(q + "nope", true, new DefaultConsumer(null))));
            out.put("unknown delivery tag", expectFault(() -> {
                Channel x = c.createChannel();
                x.basicAck(99, false);
                return x.queueDeclarePassive(q);
            }));
            c.createChannel().queueDeclare(q + "excl", false, true, false, null);
            try (Connection other = connect(uri)) {
                out.put("exclusive elsewhere", expectFault(() -> other.createChannel().queueDeclarePassive(q + "excl")));
            }
            out.put("bind missing exchange", expectFault(() -> c.createChannel().queueBind(q, q + "nope", "k")));
            out.put("declare amq. name", expectFault(() -> c.createChannel().exchangeDeclare("amq.nope", "direct")));
            out.put("delete default exchange", expectFault(() -> c.createChannel().exchangeDelete("amq.direct")));
            Channel clean = c.createChannel();
            clean.queueDelete(q);
            clean.exchangeDelete(q);
        }
        Connection c = connect(uri);
        try {
            out.put("unknown exchange type", expectFault(() -> c.createChannel().exchangeDeclare(q, "nope-type")));
            out.put("connection open after", String.valueOf(c.isOpen()));
        } finally {
            c.abort();  // closed by the broker: close() would throw
        }
        return out.toString();
    }

    static String countsAndNames(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            AMQP.Queue.DeclareOk ok = ch.queueDeclare(q, false, false, false, null);
            for (int i = 0; i < 3; i++) ch.basicPublish("", q, null, utf8("x"));
            int purged = ch.queuePurge(q).getMessageCount();
            ch.basicPublish("", q, null, utf8("y"));
            int consumers = ch.queueDeclarePassive(q).getConsumerCount();
            int deleted = ch.queueDelete(q).getMessageCount();
            String gen = ch.queueDeclare().getQueue();
            return "declared=" + ok.getQueue().equals(q) + " purged=" + purged + " consumers=" + consumers
                + " deleted=" + deleted + " generated=" + gen.startsWith("amq.gen-");
        }
    }

    static String transactions(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            ch.queueDeclare(q, false, false, false, null);
            ch.txSelect();
            ch.basicPublish("", q, null, utf8("rolled back"));
            ch.txRollback();
            long afterRollback = ch.messageCount(q);
            ch.basicPublish("", q, null, utf8("committed"));
            long beforeCommit = ch.messageCount(q);
            ch.txCommit();
            GetResponse m = ch.basicGet(q, false);
            ch.basicAck(m.getEnvelope().getDeliveryTag(), false);
            ch.txRollback();  // the ack is undone: the message stays unacked on this channel
            GetResponse held = ch.basicGet(q, false);
            ch.close();  // and comes back when the channel closes
            Channel again = c.createChannel();
            GetResponse back = again.basicGet(q, true);
            again.queueDelete(q);
            return "afterRollback=" + afterRollback + " beforeCommit=" + beforeCommit + " got=" + text(m.getBody())
                + " held=" + (held == null ? null : text(held.getBody())) + " back=" + text(back.getBody())
                + " redelivered=" + back.getEnvelope().isRedeliver();
        }
    }

    static String cancelOnDelete(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            ch.queueDeclare(q, false, false, false, null);
            List<String> events = new CopyOnWriteArrayList<>();
            String tag = ch.basicConsume(q, true, "my-tag", new DefaultConsumer(ch) {
                @Override
                public void handleCancel(String consumerTag) { events.add("cancel " + consumerTag); }

                @Override
                public void handleCancelOk(String consumerTag) { events.add("cancel-ok " + consumerTag); }
            });
            c.createChannel().queueDelete(q);
            waitFor(c, () -> !events.isEmpty());
            Thread.sleep(200);
            return "tag=" + tag + " events=" + events + " channel open=" + ch.isOpen();
        }
    }

    static String routing(String uri, String q) throws Exception {
        Map<String, List<String>> seen = new TreeMap<>();
        String[] keys = {"red", "blue", "green", "1.x.0", "1.2.3.0", "1.0", "1.x.1"};
        Map<String, String[]> kinds = new LinkedHashMap<>();
        kinds.put("direct", new String[] {"red", "blue"});
        kinds.put("topic", new String[] {"1.*.0", "1.#.0", "#"});
        kinds.put("fanout", new String[] {"ignored"});
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            for (Map.Entry<String, String[]> k : kinds.entrySet()) {
                String x = q + "." + k.getKey();
                ch.exchangeDeclare(x, k.getKey());
                String[] bks = k.getValue();
                for (int i = 0; i < bks.length; i++) {
                    ch.queueDeclare(x + ".q" + i, false, false, false, null);
                    ch.queueBind(x + ".q" + i, x, bks[i]);
                }
                for (String key : keys) ch.basicPublish(x, key, null, utf8(key));
                for (int i = 0; i < bks.length; i++) {
                    List<String> msgs = new ArrayList<>();
                    GetResponse m;
                    while ((m = ch.basicGet(x + ".q" + i, true)) != null) msgs.add(text(m.getBody()));
                    seen.put(k.getKey() + ".q" + i, msgs);
                    ch.queueDelete(x + ".q" + i);
                }
                ch.exchangeDelete(x);
            }
        }
        return seen.toString();
    }

    static String directReplyTo(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel server = c.createChannel();
            server.queueDeclare(q, false, false, false, null);
            server.basicConsume(q, true, new DefaultConsumer(server) {
                @Override
                public void handleDelivery(String tag, Envelope env, AMQP.BasicProperties p, byte[] body) throws IOException {
                    AMQP.BasicProperties reply = new AMQP.BasicProperties.Builder().correlationId(p.getCorrelationId()).build();
                    server.basicPublish("", p.getReplyTo(), reply, utf8("re:" + text(body)));
                }
            });
            // The Java client's own RPC helper over RabbitMQ's direct reply-to pseudo queue.
            com.rabbitmq.client.RpcClient rpc = new com.rabbitmq.client.RpcClient(c.createChannel(), "", q,
                "amq.rabbitmq.reply-to", (int) HANG_MS);
            String a = rpc.stringCall("one"), b = rpc.stringCall("two");
            rpc.close();
            server.queueDelete(q);
            return a + " " + b;
        }
    }

    static String deadLetterAndTtl(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            ch.exchangeDeclare(q + ".dlx", "fanout");
            ch.queueDeclare(q + ".dead", false, false, false, null);
            ch.queueBind(q + ".dead", q + ".dlx", "");
            Map<String, Object> args = new HashMap<>();
            args.put("x-dead-letter-exchange", q + ".dlx");
            args.put("x-message-ttl", 100);
            ch.queueDeclare(q, false, false, false, args);
            ch.basicPublish("", q, null, utf8("expires"));
            ch.basicPublish("", q, new AMQP.BasicProperties.Builder().expiration("0").build(), utf8("at once"));
            waitFor(c, () -> { try { return ch.messageCount(q + ".dead") >= 2; } catch (IOException e) { return true; } });
            List<String> dead = new ArrayList<>();
            GetResponse m;
            while ((m = ch.basicGet(q + ".dead", true)) != null) {
                Object death = m.getProps().getHeaders() == null ? null : m.getProps().getHeaders().get("x-death");
                String reason = death instanceof List && !((List<?>) death).isEmpty()
                    ? String.valueOf(((Map<?, ?>) ((List<?>) death).get(0)).get("reason")) : "none";
                dead.add(text(m.getBody()) + "/" + reason);
            }
            java.util.Collections.sort(dead);
            long left = ch.messageCount(q);
            ch.queueDelete(q);
            ch.queueDelete(q + ".dead");
            ch.exchangeDelete(q + ".dlx");
            return "dead=" + dead + " left=" + left;
        }
    }

    static String maxLengthRejectPublish(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            Map<String, Object> args = new HashMap<>();
            args.put("x-max-length", 2);
            args.put("x-overflow", "reject-publish");
            ch.queueDeclare(q, false, false, false, args);
            ch.confirmSelect();
            // Either broker may coalesce confirms (multiple): expand them to the tags they cover.
            java.util.SortedSet<Long> pending = java.util.Collections.synchronizedSortedSet(new java.util.TreeSet<>());
            List<Long> nacked = new CopyOnWriteArrayList<>();
            ch.addConfirmListener(
                (tag, multiple) -> confirmed(pending, tag, multiple, null),
                (tag, multiple) -> confirmed(pending, tag, multiple, nacked));
            for (int i = 0; i < 4; i++) {
                pending.add(ch.getNextPublishSeqNo());
                ch.basicPublish("", q, null, utf8("m" + i));
            }
            boolean all = ch.waitForConfirms(HANG_MS);
            long count = ch.messageCount(q);
            ch.queueDelete(q);
            java.util.Collections.sort(nacked);
            return "allAcked=" + all + " nacked=" + nacked + " count=" + count;
        }
    }

    static void confirmed(java.util.SortedSet<Long> pending, long tag, boolean multiple, List<Long> into) {
        synchronized (pending) {
            List<Long> covered = new ArrayList<>(multiple ? pending.headSet(tag + 1) : List.of(tag));
            pending.removeAll(covered);
            if (into != null) into.addAll(covered);
        }
    }

    static String alternateAndExchangeBindings(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            ch.exchangeDeclare(q + ".ae", "fanout");
            ch.queueDeclare(q + ".unrouted", false, false, false, null);
            ch.queueBind(q + ".unrouted", q + ".ae", "");
            Map<String, Object> args = new HashMap<>();
            args.put("alternate-exchange", q + ".ae");
            ch.exchangeDeclare(q + ".main", "direct", false, false, args);
            ch.exchangeDeclare(q + ".inner", "topic");
            ch.exchangeBind(q + ".inner", q + ".main", "k");
            ch.queueDeclare(q + ".bound", false, false, false, null);
            ch.queueBind(q + ".bound", q + ".inner", "#");
            ch.basicPublish(q + ".main", "k", null, utf8("via e2e"));
            ch.basicPublish(q + ".main", "other", null, utf8("to ae"));
            GetResponse bound = ch.basicGet(q + ".bound", true), unrouted = ch.basicGet(q + ".unrouted", true);
            ch.exchangeUnbind(q + ".inner", q + ".main", "k");
            ch.basicPublish(q + ".main", "k", null, utf8("after unbind"));
            GetResponse later = ch.basicGet(q + ".unrouted", true);
            for (String x : new String[] {".main", ".inner", ".ae"}) ch.exchangeDelete(q + x);
            ch.queueDelete(q + ".bound");
            ch.queueDelete(q + ".unrouted");
            return text(bound == null ? null : bound.getBody()) + " " + text(unrouted == null ? null : unrouted.getBody())
                + " " + text(later == null ? null : later.getBody());
        }
    }

    static String bigMessageAndRecover(String uri, String q) throws Exception {
        try (Connection c = connect(uri)) {
            Channel ch = c.createChannel();
            ch.queueDeclare(q, false, false, false, null);
            byte[] big = new byte[1 << 20];
            for (int i = 0; i < big.length; i++) big[i] = (byte) (i * 31);
            ch.basicPublish("", q, null, big);
            GetResponse m = ch.basicGet(q, false);
            boolean same = Arrays.equals(big, m.getBody());
            ch.basicRecover(true);  // the unacked message goes back to the queue
            GetResponse again = ch.basicGet(q, true);
            ch.queueDelete(q);
            return "same=" + same + " recovered=" + (again != null && Arrays.equals(big, again.getBody()))
                + " redelivered=" + (again != null && again.getEnvelope().isRedeliver());
        }
    }

    static String exclusiveConsumer(String uri, String q) throws Exception {
        Connection c = connect(uri);
        try {
            Channel ch = c.createChannel();
            ch.queueDeclare(q, false, false, true, null);  // auto-delete: goes with its consumer
            ch.basicConsume(q, true, "first", false, true, null, new DefaultConsumer(ch));
            String second = expectFault(() -> c.createChannel().basicConsume(q, true, new DefaultConsumer(null)));
            String tagAgain = expectFault(() -> ch.basicConsume(q, true, "first", new DefaultConsumer(ch)));
            return "second=" + second + " same tag=" + tagAgain + " connection open=" + c.isOpen();
        } finally {
            c.abort();  // closed by the broker (530): close() would throw
        }
    }

    public static void main(String[] args) throws Exception {
        String uri = args[0], prefix = args[1];
        Map<String, Step> all = new LinkedHashMap<>();
        all.put("properties", () -> properties(uri, prefix + "-props"));
        all.put("confirms_and_return", () -> confirmsAndReturn(uri, prefix + "-confirm"));
        all.put("prefetch", () -> prefetch(uri, prefix + "-prefetch"));
        all.put("nack_reject", () -> nackReject(uri, prefix + "-nack"));
        all.put("faults", () -> faults(uri, prefix + "-faults"));
        all.put("counts_and_names", () -> countsAndNames(uri, prefix + "-counts"));
        all.put("transactions", () -> transactions(uri, prefix + "-tx"));
        all.put("cancel_on_delete", () -> cancelOnDelete(uri, prefix + "-cancel"));
        all.put("routing", () -> routing(uri, prefix + "-route"));
        all.put("direct_reply_to", () -> directReplyTo(uri, prefix + "-rpc"));
        all.put("dead_letter_and_ttl", () -> deadLetterAndTtl(uri, prefix + "-dlx"));
        all.put("max_length_reject_publish", () -> maxLengthRejectPublish(uri, prefix + "-maxlen"));
        all.put("alternate_and_exchange_bindings", () -> alternateAndExchangeBindings(uri, prefix + "-ae"));
        all.put("big_message_and_recover", () -> bigMessageAndRecover(uri, prefix + "-big"));
        all.put("exclusive_consumer", () -> exclusiveConsumer(uri, prefix + "-xc"));
        for (Map.Entry<String, Step> s : all.entrySet()) {
            String outcome;
            try {
                outcome = String.valueOf(s.getValue().run());
            } catch (Exception e) {
                outcome = "FAILED " + e;
            }
            System.out.println(s.getKey() + "\t" + outcome.replace('\n', ' '));
        }
        System.exit(0);  // the client's threads would keep the JVM alive
    }
}
