"""``cmq-gateway import-definitions FILE`` and ``export-definitions FILE``: clients of a running
gateway's management API (``POST`` / ``GET /api/definitions``), as ``rabbitmqctl
import_definitions`` talks to a running node.

The import prints what was imported and what was already there per kind, every object that was
NOT imported with the reason, and the notes (imported, but without effect here). Exit status:
0 when everything was imported, 1 when something was not (it is listed), 2 when the file or
the gateway could not be read.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

__all__ = ["describe", "register"]

DEFAULT_URL = "http://localhost:15672"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    imp = sub.add_parser(
        "import-definitions", help="import a RabbitMQ definitions file into a running gateway",
        description="Import a definitions file (rabbitmqctl export_definitions, the management API's "
                    "GET /api/definitions, or the gateway's own export) into a running gateway through "
                    "its management API: vhosts, users, permissions, policies, exchanges, queues and "
                    "bindings. Whatever cannot be imported is listed with the reason. Exit status: 0 "
                    "all imported, 1 something not imported (listed), 2 the file or the gateway could "
                    "not be read.")
    imp.add_argument("file", metavar="FILE", help="the definitions JSON file; - reads standard input")
    imp.add_argument("--json", action="store_true", help="print the gateway's report as JSON")
    _client_options(imp)
    imp.set_defaults(func=_import)
    exp = sub.add_parser(
        "export-definitions", help="export a running gateway's definitions to a file",
        description="Write the running gateway's definitions (GET /api/definitions) in RabbitMQ's format; "
                    "import-definitions (or RabbitMQ) takes the file back.")
    exp.add_argument("file", metavar="FILE", help="where to write the JSON; - writes standard output")
    _client_options(exp)
    exp.set_defaults(func=_export)


def _client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL,
                   help=f"the gateway's management API (default: {DEFAULT_URL})")
    p.add_argument("--user", default=os.environ.get("CMQ_GATEWAY_USER", "guest"),
                   help="an administrator of the gateway (default: $CMQ_GATEWAY_USER, else guest)")
    p.add_argument("--password", default=os.environ.get("CMQ_GATEWAY_PASSWORD", "guest"),
                   help="its password (default: $CMQ_GATEWAY_PASSWORD, else guest)")
    p.add_argument("--vhost", default=None,
                   help="only this vhost (RabbitMQ's per-vhost definitions: every object goes into it)")


def _path(args: argparse.Namespace) -> str:
    return "/api/definitions" + ("" if args.vhost is None else "/" + quote(args.vhost, safe=""))


def _request(args: argparse.Namespace, method: str, body: bytes | None = None) -> tuple[int, bytes]:
    auth = base64.b64encode(f"{args.user}:{args.password}".encode()).decode()
    req = urllib.request.Request(args.url.rstrip("/") + _path(args), data=body, method=method,
                                 headers={"Authorization": f"Basic {auth}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _fail(text: str) -> int:
    print(f"cmq-gateway: {text}", file=sys.stderr)
    return 2


def _import(args: argparse.Namespace) -> int:
    try:
        if args.file == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as f:
                raw = f.read()
        json.loads(raw)
    except OSError as e:
        return _fail(f"cannot read {args.file}: {e.strerror or e}")
    except ValueError as e:
        return _fail(f"{args.file} is not JSON: {e}")
    try:
        status, answer = _request(args, "POST", raw)
    except OSError as e:
        return _fail(f"cannot reach {args.url}: {getattr(e, 'reason', e)}")
    if status >= 300:
        return _fail(f"{args.url} refused the import: HTTP {status} {answer.decode(errors='replace')}")
    if not answer:
        print("imported (the server sent no report: RabbitMQ?)")
        return 0
    report = json.loads(answer)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0 if report.get("complete", True) else 1


def _export(args: argparse.Namespace) -> int:
    try:
        status, answer = _request(args, "GET")
    except OSError as e:
        return _fail(f"cannot reach {args.url}: {getattr(e, 'reason', e)}")
    if status != 200:
        return _fail(f"{args.url} refused the export: HTTP {status} {answer.decode(errors='replace')}")
    text = json.dumps(json.loads(answer), indent=2) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
        return 0
    try:
        with open(args.file, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        return _fail(f"cannot write {args.file}: {e.strerror or e}")
    return 0


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counts.items() if n) or "nothing"


def describe(entry: dict[str, Any]) -> str:
    """One object of the report, as an operator names it."""
    kind = entry.get("kind", "object")
    if kind == "binding":
        what = (f"binding {entry.get('source')!r} -> {entry.get('destination_type')} {entry.get('destination')!r} "
                f"(routing key {entry.get('routing_key')!r})")
    elif kind in ("permission", "topic_permission"):
        what = f"{kind.replace('_', ' ')} of user {entry.get('user')!r}"
    elif kind == "parameter":
        what = f"parameter {entry.get('component')}/{entry.get('name')!r}"
    else:
        what = f"{kind.replace('_', ' ')} {entry.get('name', entry.get('value'))!r}"
    if entry.get("vhost") is not None:
        what += f" in vhost {entry['vhost']!r}"
    return what


def render(report: dict[str, Any]) -> str:
    lines = [f"imported:  {_counts(report.get('imported', {}))}",
             f"unchanged: {_counts(report.get('unchanged', {}))}"]
    missing = report.get("not_imported", [])
    lines.append(f"not imported: {len(missing)}")
    for e in missing:
        rule = f" [{e['rule']}]" if e.get("rule") else ""
        lines.append(f"  {describe(e)}: {e['reason']}{rule}")
    notes = report.get("notes", [])
    if notes:
        lines.append(f"notes (imported, without effect here): {len(notes)}")
        lines.extend(f"  {describe(e)}, {e['key']}: {e['reason']}" for e in notes)
    for p in report.get("policies_applied", []):
        lines.append(f"policy {p['name']!r} in vhost {p['vhost']!r} applies to {p['queues']} queues and "
                     f"{p['exchanges']} exchanges")
    return "\n".join(lines)
