"""SE4: gateway.accounts journals users, vhosts and permissions under escaped u/ keys and
applies them, tombstones included, on top of the configured database when the broker opens."""

from __future__ import annotations

from pathlib import Path

from gateway.accounts import Accounts
from gateway.auth import Permission, User, UserDB, hash_password
from gateway.broker.broker import Broker
from gateway.config import GatewayConfig
from semantics.clock import ManualClock

HASH = hash_password("pw")


def configured() -> GatewayConfig:
    users = UserDB({"cfg": User("cfg", HASH, ("management",))}, {("cfg", "/"): Permission()}, ["/"])
    return GatewayConfig(users=users)


async def test_SE4_changes_come_back_over_the_config_and_slashed_names_do_not_collide(tmp_path: Path) -> None:
    cfg = configured()
    b = await Broker.open(str(tmp_path), clock=ManualClock(), config=cfg)
    acc = Accounts(cfg.users, b)
    for v in ("a", "a/b"):
        acc.put_vhost(v)
    acc.put_user("b/c", HASH, ("monitoring",))
    acc.put_user("c", HASH, ())
    # Raw keys would share u/perm/a/b/c: (vhost a, user b/c) and (vhost a/b, user c).
    acc.set_permission("b/c", "a", Permission("^x$", ".*", ".*"))
    acc.set_permission("c", "a/b", Permission("^y$", ".*", ".*"))
    assert acc.delete_user("cfg")
    await b.flush()
    await b.close()

    again = configured()  # the config still names cfg
    b2 = await Broker.open(str(tmp_path), clock=ManualClock(), config=again)
    try:
        db = again.users
        assert set(db.users) == {"b/c", "c"}
        assert db.users["b/c"].tags == ("monitoring",)
        assert db.permissions == {("b/c", "a"): Permission("^x$", ".*", ".*"),
                                  ("c", "a/b"): Permission("^y$", ".*", ".*")}
        assert {"a", "a/b"} <= set(db.vhosts) and {"a", "a/b"} <= set(b2.vhosts)
        Accounts(db, b2).forget_vhost("a/b")
        await b2.flush()
    finally:
        await b2.close()

    third = configured()
    b3 = await Broker.open(str(tmp_path), clock=ManualClock(), config=third)
    try:
        assert "a/b" not in third.users.vhosts and ("c", "a/b") not in third.users.permissions
        assert ("b/c", "a") in third.users.permissions
    finally:
        await b3.close()
