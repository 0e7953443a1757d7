"""`cmq-gateway perf compare`: the same scenarios against two brokers, alternating a, b, a, b
so that a machine getting busier or quieter hurts both alike, and a ratio table (b / a) as
plain text and Markdown.

Per metric, the figure is the median over `--repeat` runs. For throughput a ratio above 1
means b is faster; for latency and memory a ratio below 1 means b is better.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from typing import Any

from gateway.perf.backlog import run_backlog
from gateway.perf.runner import run
from gateway.perf.scenarios import SCENARIOS, TITLES, scenario_config

__all__ = ["Row", "compare", "compare_from_args", "markdown_table", "metrics_of", "text_table"]


@dataclass
class Row:
    scenario: int
    metric: str
    unit: str
    a: float | None
    b: float | None

    @property
    def ratio(self) -> float | None:
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a


def metrics_of(scenario: int, result: dict[str, Any]) -> dict[str, tuple[str, float | None]]:
    """The figures a scenario is judged by, from a run result (or a backlog result)."""
    if scenario == 6:
        return {
            "memory per message": ("B", result["bytes_per_message"]),
            "publish": (
                "msg/s",
                result["messages"] / result["publish_seconds"] if result["publish_seconds"] else None,
            ),
            "restart recovery": ("s", result["restart_seconds"]),
        }
    lat = result["latency_us"] or {}
    rates = result["rates"]
    out: dict[str, tuple[str, float | None]] = {}
    slow = result.get("slow")
    if slow is not None:
        turn = slow["turnaround_us"] or {}
        out["slow consumer received"] = ("deliveries/s", slow["rate"])
        out["slow turnaround p50"] = ("ms", turn["p50"] / 1000 if turn else None)
        out["slow turnaround p99"] = ("ms", turn["p99"] / 1000 if turn else None)
        out["flood received"] = ("deliveries/s", rates["received"])
        return out
    if scenario != 7:
        out["sent"] = ("msg/s", rates["sent"])
        if result["config"]["confirm"]:
            out["confirmed"] = ("msg/s", rates["confirmed"])
        out["received"] = ("deliveries/s", rates["received"])
    out["latency p50"] = ("ms", lat["p50"] / 1000 if lat else None)
    out["latency p99"] = ("ms", lat["p99"] / 1000 if lat else None)
    return out


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def compare(args: argparse.Namespace, log: Any = sys.stderr) -> tuple[list[Row], list[str], list[str]]:
    """Rows, notes (saturation) and errors."""
    scenarios = args.scenarios or sorted(SCENARIOS)
    rows: list[Row] = []
    notes: list[str] = []
    failures: list[str] = []
    for n in scenarios:
        collected: dict[str, dict[str, list[float | None]]] = {"a": {}, "b": {}}
        units: dict[str, str] = {}
        for rep in range(args.repeat):
            for side in ("a", "b"):
                uri = args.uri_a if side == "a" else args.uri_b
                print(
                    f"== scenario {n} ({TITLES[n]}), {side} = {uri.split('@')[-1]}, run {rep + 1}", file=log
                )
                try:
                    result, errors = _one(args, n, side, uri, log)
                except Exception as exc:  # one broker failing a scenario must not lose the others
                    failures.append(f"scenario {n} on {side}: {exc!r}")
                    continue
                if n != 6 and result["generator"]["saturated"]:
                    notes.append(
                        f"scenario {n} on {side}: the generator was the limit (a worker at >= 90% CPU)"
                    )
                failures.extend(f"scenario {n} on {side}: {e}" for e in errors)
                for metric, (unit, value) in metrics_of(n, result).items():
                    units[metric] = unit
                    collected[side].setdefault(metric, []).append(value)
        for metric, unit in units.items():
            rows.append(
                Row(
                    n,
                    metric,
                    unit,
                    _median(collected["a"].get(metric, [])),
                    _median(collected["b"].get(metric, [])),
                )
            )
        # Show each scenario as soon as it is done, so a later failure loses nothing.
        print(text_table([r for r in rows if r.scenario == n], args.name_a, args.name_b), file=log, flush=True)
    return rows, notes, failures


def _one(args: argparse.Namespace, n: int, side: str, uri: str, log: Any) -> tuple[dict[str, Any], list[str]]:
    if n == 6:
        res = run_backlog(
            uri,
            args.backlog,
            broker_pid=getattr(args, f"broker_pid_{side}"),
            rabbitmqctl=getattr(args, f"rabbitmqctl_{side}"),
            restart_cmd=getattr(args, f"restart_{side}"),
            recover_timeout=args.recover_timeout,
        )
        return res.as_dict(), [res.error] if res.error else []
    cfg = scenario_config(n, uri, args.duration, native_tags=(side == "b" and args.tags_b))
    result = run(replace(cfg, progress=not args.quiet), log)
    return result, list(result["errors"])


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def text_table(rows: list[Row], name_a: str, name_b: str) -> str:
    head = ("#", "metric", "unit", name_a, name_b, f"{name_b}/{name_a}")
    body = [
        (
            str(r.scenario),
            r.metric,
            r.unit,
            _fmt(r.a),
            _fmt(r.b),
            f"{r.ratio:.2f}" if r.ratio is not None else "-",
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in [head, *body]]
    return "\n".join(lines)


def markdown_table(rows: list[Row], name_a: str, name_b: str) -> str:
    out = [
        f"| # | scenario | metric | {name_a} | {name_b} | {name_b} / {name_a} |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        out.append(
            f"| {r.scenario} | {TITLES[r.scenario]} | {r.metric} ({r.unit}) | {_fmt(r.a)} | {_fmt(r.b)} | {ratio} |"
        )
    return "\n".join(out) + "\n"


def compare_from_args(args: argparse.Namespace) -> int:
    if not args.uri_b:
        print("compare needs --uri-b (and --uri-a, default the local RabbitMQ)", file=sys.stderr)
        return 2
    rows, notes, failures = compare(args)
    notes = notes + [f"error: {f}" for f in failures]
    if args.json:
        print(json.dumps({"rows": [r.__dict__ | {"ratio": r.ratio} for r in rows], "notes": notes}, indent=2))
    else:
        print(text_table(rows, args.name_a, args.name_b))
        for note in notes:
            print(f"note: {note}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_table(rows, args.name_a, args.name_b))
            for note in notes:
                f.write(f"\n- {note}")
            f.write("\n")
    return 1 if failures else 0
