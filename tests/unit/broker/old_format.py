"""A data dir as the gateway wrote it before store keys were escaped (key format 0)."""

from __future__ import annotations

import time
from pathlib import Path

from gateway.broker import persistence as P
from gateway.protocol.properties import Properties
from semantics.store import Store

# (vhost, exchange, queue): the old keys of the two sides were equal (x/a/b/ex, q/a/b/c, b/...).
SIDES = [("a", "b/ex", "b/c"), ("a/b", "ex", "c")]


def old_key(kind: str, *names: str) -> str:
    """What the old code wrote: the names joined by ``/`` with no escaping at all."""
    return "/".join((kind, *names))


def write_old_format_dir(path: Path) -> dict[str, list[bytes]]:
    """A data dir as the old gateway left it: durable exchanges, queues, bindings and messages
    in vhost ``/`` and in the colliding pair above. Returns the bodies each (vhost, queue)
    should serve. The colliding declarations shared one key, so the last written won: the old
    store really held only vhost ``a/b``'s queue and exchange declarations, and both sides'
    messages (their ids differ)."""
    expect: dict[str, list[bytes]] = {}
    props = Properties.build(delivery_mode=2).raw
    now = time.time()  # within the retention period (Q6), or recovery drops them as expired
    with Store.open(str(path)) as store:
        for side, (vhost, ex, q) in enumerate([("/", "dx", "dq"), ("/", "dx", "dq/archive"), *SIDES]):
            store.put(old_key("x", vhost, ex), P.encode_json(
                {"vhost": vhost, "name": ex, "type": "direct", "auto_delete": False, "internal": False,
                 "arguments": {}}))
            store.put(old_key("q", vhost, q), P.encode_json(
                {"vhost": vhost, "name": q, "auto_delete": False, "arguments": {}}))
            store.put(old_key("b", vhost, ex, "q", q, "k"), P.encode_json(
                {"vhost": vhost, "source": ex, "kind": "q", "dest": q, "key": "k", "arguments": {}}))
            bodies = expect.setdefault(f"{vhost}|{q}", [])
            for i in range(5):
                msg_id = f"msg-{side:04x}{i:04x}"
                body = f"{vhost} {q} {i}".encode()
                store.put(old_key("m", vhost, q, msg_id),
                          P.encode_message(vhost, q, msg_id, now - 60 + i, ex, "k", props, body))
                bodies.append(body)
        store.sync()
    return expect
