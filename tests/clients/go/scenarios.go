// RabbitMQ's Go client (github.com/rabbitmq/amqp091-go, as Debian packages it) through its
// documented API, one scenario per output line: "<scenario>\t<outcome>". The outcome is plain
// text made only of what the broker answered, so that the run against RabbitMQ and the run
// against the gateway compare line by line (tests/integration/test_clients_go.py).
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go run scenarios.go URL PREFIX
package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const hang = 15 * time.Second // hang protection only; a pass never waits for it

// fault is the reply code and the class of the reply text of a channel or connection close.
func fault(err error) string {
	var e *amqp.Error
	if errors.As(err, &e) {
		return fmt.Sprintf("%d %s", e.Code, strings.SplitN(strings.TrimPrefix(e.Reason, "Exception ("), " - ", 2)[0])
	}
	if err == nil {
		return "accepted"
	}
	return "unexpected " + err.Error()
}

// typed is a header value with its Go type, keys sorted, so that an int that came back another type shows.
func typed(v interface{}) string {
	switch x := v.(type) {
	case amqp.Table:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, k+"="+typed(x[k]))
		}
		return "{" + strings.Join(parts, ",") + "}"
	case []interface{}:
		parts := make([]string, 0, len(x))
		for _, e := range x {
			parts = append(parts, typed(e))
		}
		return "[" + strings.Join(parts, ",") + "]"
	case time.Time:
		return fmt.Sprintf("time:%d", x.Unix())
	case nil:
		return "nil"
	}
	return fmt.Sprintf("%T:%v", v, v)
}

func props(d amqp.Delivery) string {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if !strings.HasPrefix(k, "x-cmq-") { // M11
			headers[k] = v
		}
	}
	id := d.MessageId
	if strings.HasPrefix(id, "msg-") { // M11: the gateway's CMQ message ID
		id = ""
	}
	return fmt.Sprintf("ct=%s ce=%s dm=%d pr=%d corr=%s reply=%s exp=%s id=%s ts=%d type=%s user=%s app=%s headers=%s",
		d.ContentType, d.ContentEncoding, d.DeliveryMode, d.Priority, d.CorrelationId, d.ReplyTo, d.Expiration,
		id, d.Timestamp.Unix(), d.Type, d.UserId, d.AppId, typed(headers))
}

func waitFor(cond func() bool) {
	deadline := time.Now().Add(hang)
	for !cond() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

type scenario struct {
	name string
	run  func(url, q string) (string, error)
}

func withChannel(url string, body func(conn *amqp.Connection, ch *amqp.Channel) (string, error)) (string, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return "", err
	}
	return body(conn, ch)
}

func properties(url, q string) (string, error) {
	return withChannel(url, func(conn *amqp.Connection, ch *amqp.Channel) (string, error) {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			return "", err
		}
		headers := amqp.Table{
			"str": "text ü", "int32": int32(7), "int64": int64(1) << 40, "int16": int16(-3), "bool": true,
			"float64": 2.5, "float32": float32(1.5), "bytes": []byte{0, 255}, "nil": nil,
			"dec": amqp.Decimal{Scale: 2, Value: 314}, "time": time.Unix(1700000000, 0),
			"table": amqp.Table{"a": int32(1)}, "list": []interface{}{int32(1), "two", false},
		}
		msg := amqp.Publishing{ContentType: "application/json", ContentEncoding: "gzip", Headers: headers,
			DeliveryMode: 2, Priority: 5, CorrelationId: "corr-1", ReplyTo: "replies", Expiration: "60000",
			MessageId: "my-id-1", Timestamp: time.Unix(1700000000, 0), Type: "order.created", UserId: "guest",
			AppId: "tests", Body: []byte("payload")}
		if err := ch.Publish("", q, false, false, msg); err != nil {
			return "", err
		}
		if err := ch.Publish("", q, false, false, amqp.Publishing{}); err != nil {
			return "", err
		}
		a, _, err := ch.Get(q, true)
		if err != nil {
			return "", err
		}
		b, _, _ := ch.Get(q, true)
		_, more, _ := ch.Get(q, true)
		_, _ = ch.QueueDelete(q, false, false, false)
		return fmt.Sprintf("%s %s | %d %s | more=%v", a.Body, props(a), len(b.Body), props(b), more), nil
	})
}

func confirmsAndReturn(url, q string) (string, error) {
	return withChannel(url, func(conn *amqp.Connection, ch *amqp.Channel) (string, error) {
		returns := ch.NotifyReturn(make(chan amqp.Return, 1))
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 100))
		if err := ch.Confirm(false); err != nil {
			return "", err
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return "", err
		}
		if err := ch.ExchangeDeclare(q, "direct", false, false, false, false, nil); err != nil {
			return "", err
		}
		for i := 0; i < 50; i++ {
			_ = ch.Publish("", q, true, false, amqp.Publishing{DeliveryMode: 2, Body: []byte(fmt.Sprint("m", i))})
		}
		_ = ch.Publish(q, "nowhere", true, false, amqp.Publishing{Body: []byte("lost")})
		acked := 0
		for i := 0; i < 51; i++ {
			select {
			case c := <-confirms:
				if c.Ack {
					acked++
				}
			case <-time.After(hang):
				return "no confirm", nil
			}
		}
		var returned string
		select {
		case r := <-returns:
			returned = fmt.Sprintf("%d %s %s %s %s", r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey, r.Body)
		case <-time.After(hang):
			returned = "none"
		}
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			return "", err
		}
		_, _ = ch.QueueDelete(q, false, false, false)
		_ = ch.ExchangeDelete(q, false, false)
		return fmt.Sprintf("returned=%s acked=%d count=%d", returned, acked, info.Messages), nil
	})
}

func prefetch(url, q string) (string, error) {
	return withChannel(url, func(conn *amqp.Connection, ch *amqp.Channel) (string, error) {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			return "", err
		}
		for i := 0; i < 5; i++ {
			_ = ch.Publish("", q, false, false, amqp.Publishing{Body: []byte(fmt.Sprint(i))})
		}
		if err := ch.Qos(2, 0, false); err != nil {
			return "", err
		}
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			return "", err
		}
		var got []string
		var last uint64
		take := func(n int) {
			deadline := time.After(hang)
			settle := time.After(time.Duration(1<<62 - 1))
			for {
				select {
				case d := <-deliveries:
					got = append(got, fmt.Sprintf("%d:%s", d.DeliveryTag, d.Body))
					last = d.DeliveryTag
					if len(got) == n {
						settle = time.After(300 * time.Millisecond) // anything beyond the prefetch would arrive now
					}
				case <-settle:
					return
				case <-deadline:
					return
				}
			}
		}
		take(2)
		first := strings.Join(got, ",")
		_ = ch.Ack(last, true)
		take(4)
		_, _ = ch.QueueDelete(q, false, false, false)
		return first + " " + strings.Join(got, ","), nil
	})
}

func nackReject(url, q string) (string, error) {
	return withChannel(url, func(conn *amqp.Connection, ch *amqp.Channel) (string, error) {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			return "", err
		}
		for _, b := range []string{"a", "b", "c"} {
			_ = ch.Publish("", q, false, false, amqp.Publishing{Body: []byte(b)})
		}
		var steps []string
		m, _, _ := ch.Get(q, false)
		steps = append(steps, fmt.Sprintf("%s%v", m.Body, m.Redelivered))
		_ = m.Nack(false, true)
		m, _, _ = ch.Get(q, false)
		steps = append(steps, fmt.Sprintf("%s%v left=%d", m.Body, m.Redelivered, m.MessageCount))
		_ = m.Reject(false)
		m, _, _ = ch.Get(q, false)
		steps = append(steps, fmt.Sprintf("%s%v", m.Body, m.Redelivered))
		_ = m.Reject(true)
		m, _, _ = ch.Get(q, false)
		steps = append(steps, fmt.Sprintf("%s%v", m.Body, m.Redelivered))
		_ = m.Nack(false, false)
		m, _, _ = ch.Get(q, false)
		steps = append(steps, fmt.Sprintf("%s%v", m.Body, m.Redelivered))
		_ = m.Ack(false)
		_, ok, _ := ch.Get(q, false)
		steps = append(steps, fmt.Sprint(ok))
		_, _ = ch.QueueDelete(q, false, false, false)
		return strings.Join(steps, ","), nil
	})
}

func faults(url, q string) (string, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	var out []string
	try := func(name string, action func(ch *amqp.Channel) error) {
		ch, err := conn.Channel()
		if err != nil {
			out = append(out, name+"=no channel "+err.Error())
			return
		}
		out = append(out, name+"="+fault(action(ch)))
	}
	try("passive missing queue", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(q+"nope", false, false, false, false, nil)
		return err
	})
	try("passive missing exchange", func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(q+"nope", "direct", false, false, false, false, nil)
	})
	// An asynchronous fault: the close the broker sends, as NotifyClose hands it over (a method
	// sent after it would race the close and get the client's own 504 instead).
	closes := func(ch *amqp.Channel, act func()) error {
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		act()
		select {
		case e := <-closed:
			if e == nil {
				return errors.New("closed without a reason")
			}
			return e
		case <-time.After(hang):
			return nil
		}
	}
	try("publish to missing exchange", func(ch *amqp.Channel) error {
		return closes(ch, func() { _ = ch.Publish(q+"nope", "k", false, false, amqp.Publishing{Body: []byte("x")}) })
	})
	main, _ := conn.Channel()
	_, _ = main.QueueDeclare(q, false, false, false, false, nil)
	try("redeclare with other durable", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		return err
	})
	try("redeclare with other arguments", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-message-ttl": int32(1000)})
		return err
	})
	_ = main.ExchangeDeclare(q, "fanout", false, false, false, false, nil)
	try("redeclare exchange other type", func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(q, "topic", false, false, false, false, nil)
	})
	try("consume missing queue", func(ch *amqp.Channel) error {
		_, err := ch.Consume(q+"nope", "", true, false, false, false, nil)
		return err
	})
	try("unknown delivery tag", func(ch *amqp.Channel) error {
		return closes(ch, func() { _ = ch.Ack(99, false) })
	})
	_, _ = main.QueueDeclare(q+"excl", false, false, true, false, nil)
	if other, err := amqp.Dial(url); err == nil {
		ch, _ := other.Channel()
		_, err := ch.QueueDeclarePassive(q+"excl", false, false, false, false, nil)
		out = append(out, "exclusive elsewhere="+fault(err))
		other.Close()
	}
	try("bind missing exchange", func(ch *amqp.Channel) error {
		return ch.QueueBind(q, "k", q+"nope", false, nil)
	})
	try("declare amq. name", func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare("amq.nope", "direct", false, false, false, false, nil)
	})
	try("delete amq.direct", func(ch *amqp.Channel) error { return ch.ExchangeDelete("amq.direct", false, false) })
	_, _ = main.QueueDelete(q, false, false, false)
	_ = main.ExchangeDelete(q, false, false)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	try("unknown exchange type", func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(q, "nope-type", false, false, false, false, nil)
	})
	select {
	case e := <-closed:
		out = append(out, "connection closed with="+fault(e))
	case <-time.After(hang):
		out = append(out, "connection open")
	}
	return strings.Join(out, ", "), nil
}

func cancelOnDelete(url, q string) (string, error) {
	return withChannel(url, func(conn *amqp.Connection, ch *amqp.Channel) (string, error) {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			return "", err
		}
		cancels := ch.NotifyCancel(make(chan string, 1))
		deliveries, err := ch.Consume(q, "my-tag", true, false, false, false, nil)
		if err != nil {
			return "", err
		}
		other, _ := conn.Channel()
		if _, err := other.QueueDelete(q, false, false, false); err != nil {
			return "", err
		}
		var tag string
		select {
		case tag = <-cancels:
		case <-time.After(hang):
			tag = "none"
		}
		_, open := <-deliveries // the client closes the consumer's channel of deliveries
		err = ch.ExchangeDeclarePassive("amq.direct", "direct", true, false, false, false, nil)
		return fmt.Sprintf("cancelled=%s deliveries open=%v channel=%s", tag, open, fault(err)), nil
	})
}

func directReplyTo(url, q string) (string, error) {
	return withChannel(url, func(conn *amqp.Connection, server *amqp.Channel) (string, error) {
		if _, err := server.QueueDeclare(q, false, false, false, false, nil); err != nil {
			return "", err
		}
		requests, _ := server.Consume(q, "", true, false, false, false, nil)
		go func() {
			for d := range requests {
				_ = server.Publish("", d.ReplyTo, false, false, amqp.Publishing{CorrelationId: d.CorrelationId,
					Body: append([]byte("re:"), d.Body...)})
			}
		}()
		client, _ := conn.Channel()
		replies, err := client.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
		if err != nil {
			return "", err
		}
		for i, body := range []string{"one", "two"} {
			_ = client.Publish("", q, false, false, amqp.Publishing{ReplyTo: "amq.rabbitmq.reply-to",
				CorrelationId: fmt.Sprint(i + 1), Body: []byte(body)})
		}
		var got []string
		for len(got) < 2 {
			select {
			case r := <-replies:
				got = append(got, r.CorrelationId+":"+string(r.Body))
			case <-time.After(hang):
				return "replies " + strings.Join(got, " "), nil
			}
		}
		_, _ = client.QueueDelete(q, false, false, false)
		return strings.Join(got, " "), nil
	})
}

func deadLetterAndTTL(url, q string) (string, error) {
	return withChannel(url, func(conn *amqp.Connection, ch *amqp.Channel) (string, error) {
		_ = ch.ExchangeDeclare(q+".dlx", "fanout", false, false, false, false, nil)
		_, _ = ch.QueueDeclare(q+".dead", false, false, false, false, nil)
		_ = ch.QueueBind(q+".dead", "", q+".dlx", false, nil)
		if _, err := ch.QueueDeclare(q, false, false, false, false,
			amqp.Table{"x-dead-letter-exchange": q + ".dlx", "x-message-ttl": int32(100)}); err != nil {
			return "", err
		}
		_ = ch.Publish("", q, false, false, amqp.Publishing{Body: []byte("expires")})
		_ = ch.Publish("", q, false, false, amqp.Publishing{Expiration: "0", Body: []byte("at once")})
		var dead []string
		waitFor(func() bool {
			m, ok, err := ch.Get(q+".dead", true)
			if err != nil {
				return true
			}
			if ok {
				reason := "none"
				if deaths, _ := m.Headers["x-death"].([]interface{}); len(deaths) > 0 {
					if first, ok := deaths[0].(amqp.Table); ok {
						reason = fmt.Sprint(first["reason"])
					}
				}
				dead = append(dead, string(m.Body)+"/"+reason)
			}
			return len(dead) >= 2
		})
		sort.Strings(dead)
		info, _ := ch.QueueDeclarePassive(q, false, false, false, false,
			amqp.Table{"x-dead-letter-exchange": q + ".dlx", "x-message-ttl": int32(100)})
		_, _ = ch.QueueDelete(q, false, false, false)
		_, _ = ch.QueueDelete(q+".dead", false, false, false)
		_ = ch.ExchangeDelete(q+".dlx", false, false)
		return fmt.Sprintf("dead=%s left=%d", strings.Join(dead, ","), info.Messages), nil
	})
}

func maxLengthRejectPublish(url, q string) (string, error) {
	return withChannel(url, func(conn *amqp.Connection, ch *amqp.Channel) (string, error) {
		if _, err := ch.QueueDeclare(q, false, false, false, false,
			amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"}); err != nil {
			return "", err
		}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 4))
		_ = ch.Confirm(false)
		for i := 0; i < 4; i++ {
			_ = ch.Publish("", q, false, false, amqp.Publishing{Body: []byte(fmt.Sprint("m", i))})
		}
		var outcomes []string
		for i := 0; i < 4; i++ {
			select {
			case c := <-confirms:
				outcomes = append(outcomes, fmt.Sprintf("%d:%v", c.DeliveryTag, c.Ack))
			case <-time.After(hang):
				outcomes = append(outcomes, "missing")
			}
		}
		info, _ := ch.QueueDeclarePassive(q, false, false, false, false,
			amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
		_, _ = ch.QueueDelete(q, false, false, false)
		return fmt.Sprintf("%s count=%d", strings.Join(outcomes, ","), info.Messages), nil
	})
}

func alternateAndExchangeBindings(url, q string) (string, error) {
	return withChannel(url, func(conn *amqp.Connection, ch *amqp.Channel) (string, error) {
		_ = ch.ExchangeDeclare(q+".ae", "fanout", false, false, false, false, nil)
		_, _ = ch.QueueDeclare(q+".unrouted", false, false, false, false, nil)
		_ = ch.QueueBind(q+".unrouted", "", q+".ae", false, nil)
		_ = ch.ExchangeDeclare(q+".main", "direct", false, false, false, false, amqp.Table{"alternate-exchange": q + ".ae"})
		_ = ch.ExchangeDeclare(q+".inner", "topic", false, false, false, false, nil)
		if err := ch.ExchangeBind(q+".inner", "k", q+".main", false, nil); err != nil {
			return "", err
		}
		_, _ = ch.QueueDeclare(q+".bound", false, false, false, false, nil)
		_ = ch.QueueBind(q+".bound", "#", q+".inner", false, nil)
		_ = ch.Publish(q+".main", "k", false, false, amqp.Publishing{Body: []byte("via e2e")})
		_ = ch.Publish(q+".main", "other", false, false, amqp.Publishing{Body: []byte("to ae")})
		bound, _, _ := ch.Get(q+".bound", true)
		unrouted, _, _ := ch.Get(q+".unrouted", true)
		_ = ch.ExchangeUnbind(q+".inner", "k", q+".main", false, nil)
		_ = ch.Publish(q+".main", "k", false, false, amqp.Publishing{Body: []byte("after unbind")})
		later, _, _ := ch.Get(q+".unrouted", true)
		for _, x := range []string{".main", ".inner", ".ae"} {
			_ = ch.ExchangeDelete(q+x, false, false)
		}
		_, _ = ch.QueueDelete(q+".bound", false, false, false)
		_, _ = ch.QueueDelete(q+".unrouted", false, false, false)
		return fmt.Sprintf("%s %s %s", bound.Body, unrouted.Body, later.Body), nil
	})
}

func main() {
	url, prefix := os.Args[1], os.Args[2]
	all := []scenario{
		{"properties", properties}, {"confirms_and_return", confirmsAndReturn}, {"prefetch", prefetch},
		{"nack_reject", nackReject}, {"faults", faults}, {"cancel_on_delete", cancelOnDelete},
		{"direct_reply_to", directReplyTo}, {"dead_letter_and_ttl", deadLetterAndTTL},
		{"max_length_reject_publish", maxLengthRejectPublish},
		{"alternate_and_exchange_bindings", alternateAndExchangeBindings},
	}
	for _, s := range all {
		outcome, err := s.run(url, prefix+"-"+strings.ReplaceAll(s.name, "_", ""))
		if err != nil {
			outcome = "FAILED " + err.Error()
		}
		fmt.Printf("%s\t%s\n", s.name, strings.ReplaceAll(outcome, "\n", " "))
	}
}
