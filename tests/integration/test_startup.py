"""Start-up: the whole config checked at once, every start-up error one line, the data dir's
lock taken before anything in it (or in the audit dir) is touched. Real `serve` processes."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
import yaml

from gateway.config import ConfigError, parse_config
from tests.integration.differential import blocking
from tests.integration.test_process import ROOT, serve

# `rabbitmqctl export_definitions` of RabbitMQ 3.10.8 as installed (guest's hash is "guest").
RABBIT_EXPORT = {
    "bindings": [], "exchanges": [], "global_parameters": [], "parameters": [], "policies": [], "queues": [],
    "rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8", "topic_permissions": [],
    "permissions": [{"configure": ".*", "read": ".*", "user": "guest", "vhost": "/", "write": ".*"}],
    "users": [{"hashing_algorithm": "rabbit_password_hashing_sha256", "limits": {}, "name": "guest",
               "password_hash": "IVk1GveF3R2aexpxyI0OrsQHl40YSNE1O5pd/x+/fgQTzGsh", "tags": ["administrator"]}],
    "vhosts": [{"limits": [], "metadata": {"description": "Default virtual host", "tags": []}, "name": "/"}],
}


def run_serve(*args: str) -> subprocess.CompletedProcess[str]:
    """`serve` that is expected to refuse to start: loopback, free ports unless given."""
    defaults = {"--port": "0", "--management-port": "off", "--metrics-port": "off", "--cmq-api-port": "off",
                "--mqtt-port": "off"}
    extra = [x for flag, value in defaults.items() if flag not in args for x in (flag, value)]
    return subprocess.run([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", *extra, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    return done.stderr.rstrip("\n")


# --- the config file --------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "line"), [
    ("listners: [{host: 127.0.0.1, port: 5999}]\n",
     "config: unknown key 'listners' (did you mean 'listeners'?)"),
    ("limits: {frame_max: big}\n",
     "config: limits.frame_max: expected an integer 4096..2147483647, got 'big'"),
    ("limits: {heartbeats: 5}\n",
     "config: limits: unknown key 'heartbeats' (did you mean 'heartbeat'?)"),
    ("listeners: [{host: 127.0.0.1, port: 70000}]\n",
     "config: listeners[0].port: expected an integer 0..65535, got 70000"),
    ("users: [{name: alice, password: pw, tgas: [administrator]}]\n",
     "config: users[0]: unknown key 'tgas' (did you mean 'tags'?)"),
    ("audit: {rotate_bytes: 0}\n", "config: audit.rotate_bytes: expected an integer >= 1, got 0"),
    ("management: {port: 15672, hots: 0.0.0.0}\n",
     "config: management: unknown key 'hots' (did you mean 'host'?)"),
    ("vhosts: [orders]\npermissions: [{user: guest, vhost: order, configure: '', write: '', read: ''}]\n",
     "config: permissions[0].vhost: 'order' is not in vhosts (orders)"),
    ("limits:\n\tframe_max: 131072\n", "config: {path} is not valid YAML: found character '\\t' that "
                                       "cannot start any token at line 2, column 1 (while scanning for the next token)"),
    ("- listeners\n", "config: the top level must be a mapping of keys, got ['listeners']"),
])
def test_config_errors_are_one_line_naming_the_key(tmp_path: Path, text: str, line: str) -> None:
    """A wrong config never starts a gateway (frame_max: big used to start, then every
    connection failed with 541): one line with the key path and what is allowed, exit 2."""
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    done = run_serve("--data-dir", str(tmp_path / "data"), "--config", str(path))
    assert (done.returncode, one_line(done)) == (2, "cmq-gateway: " + line.format(path=path))
    assert not (tmp_path / "data").exists()  # refused before anything was created


def test_unreadable_config_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "latin1.yaml").write_bytes(b"cluster_name: caf\xe9\n")
    cases = {tmp_path / "missing.yaml": "cannot read {path}: no such file or directory",
             tmp_path: "cannot read {path}: is a directory",
             tmp_path / "latin1.yaml": "{path} is not UTF-8 text (byte 17)"}
    for path, line in cases.items():
        done = run_serve("--data-dir", str(tmp_path / "data"), "--config", str(path))
        assert (done.returncode, one_line(done)) == (2, "cmq-gateway: config: " + line.format(path=path))


def test_every_key_of_the_schema_is_checked_at_its_own_path() -> None:
    """Unknown keys and wrong types at every nesting level, including the keys of the
    branches being merged (tls, handshake_timeout, ..., profile, push)."""
    wrong = {
        "listeners": [5672, {"host": "::1", "port": "5672"}],
        "users": [{"name": "a", "password_hash": "<base64>"}],
        "vhosts": [{"name": "v", "profile": "rabbit"}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": "(", "write": "", "read": ""}],
        "audit": {"events": ["publsh"]},
        "tls": {"verify": "peer"},
        "push": {"allow": "http://x"},
        "profile": "CMQ",
        "limits": {"max_message_size": 536870913},
    }
    said = {}
    for key, value in wrong.items():
        with pytest.raises(ConfigError) as e:
            parse_config({key: value})
        said[key] = str(e.value)
    assert said == {
        "listeners": "config: listeners[1].port: expected an integer 0..65535, got '5672'",
        "users": "config: users[0].password_hash: expected RabbitMQ's base64 salted SHA-256, SHA-512 or MD5 "
                 "(as rabbitmqctl export_definitions writes it; or give password: instead), got '<base64>'",
        "vhosts": "config: vhosts[0].profile: expected one of compatible, cmq, got 'rabbit'",
        "permissions": "config: permissions[0].configure: expected a regular expression, got '('",
        "audit": "config: audit.events[0]: expected one of " + ", ".join(sorted(_events())) +
                 ", got 'publsh' (did you mean 'publish'?)",
        "tls": "config: tls.verify: expected one of verify_none, verify_peer, got 'peer'",
        "push": "config: push.allow: expected a list (of a string), got 'http://x'",
        "profile": "config: profile: expected one of compatible, cmq, got 'CMQ' (did you mean 'cmq'?)",
        "limits": "config: limits.max_message_size: expected an integer 1..536870912, got 536870913",
    }
    good = {"tls": {"certfile": "c.pem", "keyfile": "k.pem", "cafile": "ca.pem", "verify": "verify_peer",
                    "fail_if_no_peer_cert": True, "port": 5671},
            "limits": {"handshake_timeout": 10, "disk_free_limit": 50_000_000, "max_message_size": 1 << 27},
            "profile": "cmq", "vhosts": [{"name": "/", "profile": "compatible"}], "push": {"allow": ["https://x/*"]},
            "management": "off", "metrics": False, "audit": {"events": None}, "data_dir": None}
    cfg = parse_config(good)
    assert (cfg.management_port, cfg.metrics_port, cfg.data_dir, cfg.audit.events) == (-1, -1, None, None)


def test_the_schema_names_every_setting_of_limits_and_audit() -> None:
    """A field added to Limits or AuditSettings without a SCHEMA entry would be refused as an
    unknown key; SCHEMA's other entries are the keys the merging branches read."""
    import dataclasses

    from gateway.config import AuditSettings, Limits
    from gateway.config_schema import AUDIT, LIMITS

    assert {f.name for f in dataclasses.fields(Limits)} <= set(LIMITS.keys)
    assert {f.name for f in dataclasses.fields(AuditSettings)} == set(AUDIT.keys)


def _events() -> frozenset[str]:
    from gateway.audit import EVENTS
    return EVENTS


def test_W2_a_rabbitmq_3_10_export_passes_as_is() -> None:
    cfg = parse_config(json.loads(json.dumps(RABBIT_EXPORT)))
    assert cfg.users.authenticate("PLAIN", "\x00guest\x00guest", from_loopback=True).tags == ("administrator",)


def test_W2_vhosts_without_users_keep_guest() -> None:
    """`vhosts: [...]` alone used to leave no user at all: nobody could log in."""
    cfg = parse_config({"vhosts": ["/", "orders"]})
    assert cfg.users.authenticate("PLAIN", "\x00guest\x00guest", from_loopback=True).name == "guest"
    assert cfg.users.vhost_permission("guest", "/") is not None


def _readme_config() -> str:
    text = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, "docs/CONFIGURATION.md's Configuration section has no yaml block"
    return block.group(1)


def test_W2_the_readme_example_config_starts_and_its_users_log_in(tmp_path: Path) -> None:
    """The example of docs/CONFIGURATION.md, as printed (port, data dir and audit dir overridden), starts and
    every user it gives a password can open a vhost it has rights on."""
    text = _readme_config()
    (tmp_path / "gw.yaml").write_text(text)
    raw = yaml.safe_load(text)
    logins = [(u["name"], u["password"], p["vhost"]) for u in raw["users"] if "password" in u
              for p in raw.get("permissions", []) if p["user"] == u["name"]]
    assert logins, "the example config has no user who can connect"
    with serve(tmp_path / "data", "--config", str(tmp_path / "gw.yaml"),
               "--audit-dir", str(tmp_path / "audit")) as (_proc, port):
        for user, password, vhost in logins:
            params = pika.ConnectionParameters("127.0.0.1", port, vhost, pika.PlainCredentials(user, password))
            conn = pika.BlockingConnection(params)
            try:
                assert conn.channel().is_open
            finally:
                conn.close()


# --- the command line, ports and directories --------------------------------------------------

def test_bad_port_is_one_line() -> None:
    done = run_serve("--port", "70000")
    assert (done.returncode, one_line(done)) == (
        2, "cmq-gateway serve: argument --port: port 70000 is out of range 0-65535 (see cmq-gateway serve --help)")


@pytest.mark.parametrize(("option", "where", "line"), [
    # /sys refuses mkdir even to root: an unwritable place wherever the tests run.
    ("--data-dir", "/sys/cmq-gateway-test", "data dir {dir} cannot be used: operation not permitted: "
                                            "choose another with --data-dir"),
    ("--data-dir", "{file}/data", "data dir {dir} cannot be used: not a directory: choose another with --data-dir"),
    ("--data-dir", "{file}", "data dir {dir} cannot be used: not a directory: choose another with --data-dir"),
    ("--audit-dir", "/sys/cmq-gateway-test", "audit dir {dir} cannot be used: operation not permitted: "
                                             "choose another with --audit-dir"),
    ("--audit-dir", "{file}/audit", "audit dir {dir} cannot be used: not a directory: "
                                    "choose another with --audit-dir"),
])
def test_unusable_directory_is_one_line(tmp_path: Path, option: str, where: str, line: str) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    directory = where.format(file=file)
    args = [option, directory] if option == "--data-dir" else ["--data-dir", str(tmp_path / "d"), option, directory]
    done = run_serve(*args)
    assert (done.returncode, one_line(done)) == (1, "cmq-gateway: " + line.format(dir=directory))


def test_a_store_file_the_os_refuses_is_one_line(tmp_path: Path) -> None:
    journal = tmp_path / "journal-00000001.log"
    journal.mkdir()  # where the store expects a file
    done = run_serve("--data-dir", str(tmp_path))
    assert (done.returncode, one_line(done)) == (1, f"cmq-gateway: cannot start: {journal}: is a directory")


# --- a second gateway on a data dir (or audit dir) in use ---------------------------------------

def _wait_for(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + 30  # hang protection only
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _audit_files(audit: Path) -> dict[str, bytes]:
    found = {}
    for p in audit.rglob("*.jsonl*"):
        try:
            found[str(p.relative_to(audit))] = p.read_bytes()
        except FileNotFoundError:  # rotated (renamed) since the listing: seen on the next look
            continue
    return found


def _publish(port: int, n: int) -> None:
    with blocking(f"amqp://guest:guest@127.0.0.1:{port}/%2F") as conn:
        ch = conn.channel()
        ch.queue_declare("startup-q")
        for i in range(n):
            ch.basic_publish("", "startup-q", b"x" * 100 + str(i).encode())


@pytest.mark.parametrize("audit_outside", [False, True])
def test_A3_second_serve_is_refused_before_touching_the_running_audit_log(tmp_path: Path,
                                                                          audit_outside: bool) -> None:
    """The refused second gateway used to close (rename) the running one's open audit file,
    whose writer then failed at its next rotation. Now it takes the data dir's lock (and the
    audit dir's, when that lies outside) first and leaves both untouched."""
    data, audit = tmp_path / "data", (tmp_path / "audit" if audit_outside else tmp_path / "data" / "audit")
    config = tmp_path / "gw.yaml"
    config.write_text("audit: {rotate_bytes: 20000}\n")
    audit_args = ["--audit-dir", str(audit)] if audit_outside else []
    with serve(data, "--config", str(config), *audit_args) as (proc, port):
        _publish(port, 5)
        # The publisher's last record written: the open file then stays as it is while idle.
        _wait_for(lambda: any(name.endswith(".open") and b'"event":"connection_close"' in data
                              for name, data in _audit_files(audit).items()), "an open audit file")
        before = _audit_files(audit)

        # Same data dir; or, with the audit dir outside, another data dir and the same audit dir.
        second_data = tmp_path / "other-data" if audit_outside else data
        done = run_serve("--data-dir", str(second_data), "--config", str(config), *audit_args)
        # A7: an audit dir in use names its holder and exits 2 (tests/integration/test_audit_lock.py).
        code, what, directory, option, holder = (
            (2, "audit dir", audit, "--audit-dir", f" (pid {proc.pid} on host {socket.gethostname()})")
            if audit_outside else (1, "data dir", data, "--data-dir", ""))
        assert (done.returncode, one_line(done)) == (
            code, f"cmq-gateway: {what} {directory} is in use by another cmq-gateway{holder}: stop that one, "
                  f"or choose another directory with {option}")
        assert _audit_files(audit) == before

        # The first keeps writing through rotations: its open file is closed by its own writer.
        (open_name,) = [name for name in before if name.endswith(".open")]
        closed_name = str(Path(open_name).parent / Path(open_name).name[1:-len(".open")])
        _publish(port, 400)
        _wait_for(lambda: closed_name in _audit_files(audit), "the first file's rotation")
        _wait_for(lambda: sum(f.count(b'"event":"publish"') for f in _audit_files(audit).values()) == 405,
                  "every publish in the audit log")
        assert proc.poll() is None
        assert _audit_files(audit)[closed_name].startswith(before[open_name])


def test_W2_sha512_and_md5_users_of_an_export_are_taken_by_the_config() -> None:
    """RabbitMQ's other hashing modules pass the config check and log in (an export of a node
    configured with rabbit_password_hashing_sha512 is a valid config)."""
    import base64
    import hashlib

    salt = b"\x09\x08\x07\x06"
    for digest, algorithm in ((hashlib.sha512, "rabbit_password_hashing_sha512"),
                              (hashlib.md5, "rabbit_password_hashing_md5")):
        h = base64.b64encode(salt + digest(salt + b"pw").digest()).decode()
        cfg = parse_config({"users": [{"name": "u", "password_hash": h, "hashing_algorithm": algorithm}],
                            "permissions": [{"user": "u", "vhost": "/", "configure": ".*", "write": ".*",
                                             "read": ".*"}]})
        assert cfg.users.authenticate("PLAIN", "\x00u\x00pw", from_loopback=False).name == "u"
