"""gateway.jetstream.wire's read path over a real nats-server: messages of every size (cut
across the connection's reads at any point), with and without headers and reply subjects,
reach a wire handler whole and in order, next to a subscription nats-py itself serves on the
same connection; and what one read brought is handed on before its read-end callback runs."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import nats

from gateway.jetstream import wire
from tests.support.natsd import NatsCluster
from tests.support.natsd_interest import subscribed


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_wire_handler_reads_every_message_whole_and_in_order(tmp_path: Path) -> None:
    with NatsCluster(tmp_path / "nats", 1) as cluster:
        url = cluster.store_url

        async def main() -> None:
            reader = await nats.connect(url)
            writer = await nats.connect(url)
            rnd = random.Random(28)
            sent: list[tuple[str, str, bytes, dict[str, str] | None]] = []
            got: list[tuple[str, str, bytes, dict[str, str] | None]] = []
            plain: list[bytes] = []
            ends = 0
            done = asyncio.Event()
            handlers = wire.Handlers.of(reader)

            def on_read_end() -> None:
                nonlocal ends
                ends += 1

            def handler(d: wire.Delivery) -> None:
                got.append((d.subject, d.reply, d.data, d.headers))
                handlers.at_read_end(on_read_end)
                if len(got) == len(sent) and plain:
                    done.set()

            async def on_plain(m: object) -> None:
                plain.append(m.data)  # type: ignore[attr-defined]
                if len(got) == len(sent):
                    done.set()

            sub = await reader.subscribe("h1.wire.*", pending_msgs_limit=-1, pending_bytes_limit=-1)
            handlers.add(sub, handler)
            await reader.subscribe("h1.plain", cb=on_plain)
            await subscribed(reader)  # the writer's first message must find them
            for i in range(600):
                size = rnd.choice((0, 1, 16, 1000, 70_000, rnd.randrange(200_000)))
                data = rnd.randbytes(size)
                reply = rnd.choice(("", f"_INBOX.x.{i}"))
                headers = rnd.choice((None, {"Nats-Msg-Id": f"msg-{i}", "X-N": str(i)}))
                subject = f"h1.wire.{i}"
                sent.append((subject, reply, data, headers))
                await writer.publish(subject, data, reply=reply, headers=headers)
                if i == 300:
                    await writer.publish("h1.plain", b"nats-py's own")
            await writer.flush()
            try:
                await asyncio.wait_for(done.wait(), 20)
            except TimeoutError:
                raise AssertionError(f"got {len(got)} of {len(sent)}, plain {plain}")
            assert plain == [b"nats-py's own"]
            assert [g[:3] for g in got] == [s[:3] for s in sent]
            for (_, _, _, h), (_, _, _, want) in zip(got, sent, strict=True):
                assert h == want
            assert 0 < ends <= len(sent)
            await writer.close()
            await reader.close()

        _run(main())


def test_send_goes_out_in_the_next_turn_and_a_read_end_comes_before_it(tmp_path: Path) -> None:
    """Issue 28's latency: a command handed to ``wire.send`` is on the socket after one turn
    of the loop (no task, no flusher turn, no batch to fill), and the read-end callback of
    the read that brought a delivery runs before anything scheduled while handling it: the
    delivery is taken in the read's own turn."""
    with NatsCluster(tmp_path / "nats", 1) as cluster:

        async def main() -> None:
            reader = await nats.connect(cluster.store_url)
            writer = await nats.connect(cluster.store_url)
            loop = asyncio.get_running_loop()
            order: list[str] = []
            arrived = asyncio.Event()
            handlers = wire.Handlers.of(reader)

            def handler(d: wire.Delivery) -> None:
                order.append(d.data.decode())
                loop.call_soon(order.append, "next turn")
                handlers.at_read_end(lambda: order.append("read end"))
                arrived.set()

            sub = await reader.subscribe("h1.turn", pending_msgs_limit=-1, pending_bytes_limit=-1)
            handlers.add(sub, handler)
            await subscribed(reader)
            await writer.flush()
            assert wire.send(writer, [wire.pub("h1.turn", "", b"one")])
            assert writer._pending  # queued in this turn...
            await asyncio.sleep(0)
            assert not writer._pending and not writer._pending_data_size  # ...written in the next
            await asyncio.wait_for(arrived.wait(), 30)
            await asyncio.sleep(0)
            assert order == ["one", "read end", "next turn"]
            await writer.close()
            await reader.close()

        _run(main())


def test_reads_go_to_handlers_from_the_socket_in_order_and_again_after_a_reconnect(tmp_path: Path) -> None:
    """Issue 28's latency: once nats-py's read loop has read on a connection, what the socket
    brings reaches a wire handler from the socket's own callback (outside any task: no turn of
    the read loop), while whatever nats-py serves (its own subscriptions, PONGs) goes through
    its read loop; messages of both kinds, cut across reads, arrive whole and in order; after
    the server restarts, the new connection's reads go the same way."""
    with NatsCluster(tmp_path / "nats", 1) as cluster:

        async def main() -> None:
            reader = await nats.connect(cluster.store_url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
            writer = await nats.connect(cluster.store_url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
            rnd = random.Random(2803)
            got: list[bytes] = []
            plain: list[bytes] = []
            from_socket = 0
            handlers = wire.Handlers.of(reader)

            def handler(d: wire.Delivery) -> None:
                nonlocal from_socket
                got.append(d.data)
                if asyncio.current_task() is None:
                    from_socket += 1

            async def on_plain(m: object) -> None:
                plain.append(m.data)  # type: ignore[attr-defined]

            sub = await reader.subscribe("h3.wire", pending_msgs_limit=-1, pending_bytes_limit=-1)
            handlers.add(sub, handler)
            await reader.subscribe("h3.plain", cb=on_plain)
            # not flush() alone: its PING could pass the SUBs and a-0 find no interest (the flake)
            await subscribed(reader)

            async def round_(tag: str) -> tuple[list[bytes], list[bytes]]:
                want: list[bytes] = []
                want_plain: list[bytes] = []
                for i in range(1500):
                    size = rnd.choice((0, 8, 16, 1000, 40_000, rnd.randrange(150_000)))
                    data = b"%s-%d-" % (tag.encode(), i) + rnd.randbytes(size)
                    if rnd.random() < 0.1:
                        want_plain.append(data)
                        await writer.publish("h3.plain", data)
                    else:
                        want.append(data)
                        await writer.publish("h3.wire", data, headers=rnd.choice((None, {"X-N": str(i)})))
                    if i % 97 == 0:
                        await reader.flush()  # a PING and its PONG amid the messages
                await writer.flush()
                for _ in range(400):
                    if len(got) >= len(want) and len(plain) >= len(want_plain):
                        break
                    await asyncio.sleep(0.05)
                return want, want_plain

            async def reaches_from_socket(since: int) -> bool:
                # A loaded machine can keep the read loop behind for a whole round (every read
                # then waits behind its buffer, in order, as it must); a message published to an
                # idle reader takes the socket's path whenever it works at all.
                for k in range(50):
                    if from_socket > since:
                        return True
                    n = len(got)
                    await writer.publish("h3.wire", b"idle-%d" % k)
                    await writer.flush()
                    for _ in range(200):
                        if len(got) > n:
                            break
                        await asyncio.sleep(0.01)
                return from_socket > since

            want, want_plain = await round_("a")
            assert got == want
            assert plain == want_plain
            assert await reaches_from_socket(0)
            before = from_socket
            got.clear()
            plain.clear()

            cluster.restart(0)
            # nats-py writes the SUBs again on the new socket before it counts as connected,
            # so the reader's flush below pings behind them (no subscribed() needed)
            for _ in range(200):
                try:
                    if reader.is_connected and writer.is_connected:
                        await reader.flush(timeout=1)
                        await writer.flush(timeout=1)
                        break
                except Exception:
                    pass
                await asyncio.sleep(0.1)
            want, want_plain = await round_("b")
            assert got == want
            assert plain == want_plain
            assert await reaches_from_socket(before)
            await writer.close()
            await reader.close()

        _run(main())


def test_subscribed_returns_after_the_pong_to_a_ping_behind_the_subscriptions(tmp_path: Path) -> None:
    """tests.support.natsd_interest.subscribed, which the tests above rely on before publishing
    from another connection: what the client wrote (recorded by a proxy on its way to the
    server) ends with a PING after the last SUB, whose PONG the server sends only after taking
    them, and a message published at once from another connection arrives. With nats-py's
    flush() alone the bytes were PING, SUB, SUB (its PING passes the queued SUBs), and 84 of
    2,000 such first messages were dropped by the server for want of interest."""
    with NatsCluster(tmp_path / "nats", 1) as cluster:

        async def main() -> None:
            sent: list[bytes] = []  # client to server, as the proxy read it

            async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, record: bool) -> None:
                while data := await r.read(65536):
                    if record:
                        sent.append(data)
                    w.write(data)

            async def proxy(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
                sr, sw = await asyncio.open_connection("127.0.0.1", cluster.servers[0].port)
                await asyncio.gather(pipe(cr, sw, True), pipe(sr, cw, False), return_exceptions=True)
                sw.close()
                cw.close()

            server = await asyncio.start_server(proxy, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            reader = await nats.connect(f"nats://127.0.0.1:{port}")
            writer = await nats.connect(cluster.store_url)
            got = asyncio.Event()
            handlers = wire.Handlers.of(reader)

            async def on_plain(m: object) -> None:
                pass

            written = len(sent)
            sub = await reader.subscribe("h4.wire", pending_msgs_limit=-1, pending_bytes_limit=-1)
            handlers.add(sub, lambda d: got.set())
            await reader.subscribe("h4.plain", cb=on_plain)
            await subscribed(reader)
            after = b"".join(sent[written:])
            assert after.rfind(b"PING\r\n") > after.rfind(b"SUB h4.plain "), after
            assert after.count(b"SUB ") == 2 and after.count(b"PING\r\n") == 2, after
            await writer.publish("h4.wire", b"a-0-")
            await writer.flush()
            await asyncio.wait_for(got.wait(), 30)
            await writer.close()
            await reader.close()
            server.close()

        _run(main())
