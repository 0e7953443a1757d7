"""``cmq-audit``: reports over the gateway's audit log.

    cmq-audit report --audit-dir DIR[,DIR...] --out DIR [--from T --to T] [--master URL]
    cmq-audit demo --audit-dir DIR [--messages N]     # a plausible log to try the report on
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gateway import version

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cmq-audit", description="Analyse the CMQ gateway's audit log with Spark.")
    parser.add_argument("--version", action="version", version=f"cmq-audit {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    rep = sub.add_parser("report", help="write an HTML report with plots")
    rep.add_argument("--audit-dir", required=True, metavar="DIR",
                     help="the gateway's --audit-dir; several gateways' comma-separated or as a glob")
    rep.add_argument("--out", required=True, metavar="DIR", help="where index.html and the PNGs go")
    rep.add_argument("--from", dest="start", metavar="T", help="ISO-8601 UTC time or Unix seconds (inclusive)")
    rep.add_argument("--to", dest="end", metavar="T", help="ISO-8601 UTC time or Unix seconds (exclusive)")
    rep.add_argument("--master", default=None, metavar="URL",
                     help="Spark master (default: spark-submit's, else local[*])")
    demo = sub.add_parser("demo", help="write a synthetic audit log to try the report on")
    demo.add_argument("--audit-dir", required=True, metavar="DIR")
    demo.add_argument("--messages", type=int, default=20_000)
    return parser


def _session(master: str | None):  # type: ignore[no-untyped-def]
    # Executors must run this interpreter (it has pyarrow and this package) unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    # Spark's console progress bars would mix into the report's one-line-per-step progress.
    builder = (SparkSession.builder.appName("cmq-audit report").config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false"))
    if master:
        builder = builder.master(master)
    elif not os.environ.get("PYSPARK_GATEWAY_PORT"):  # not under spark-submit, which sets the master
        builder = builder.master("local[*]")
    return builder.getOrCreate()


def _bad_input(args: argparse.Namespace) -> str | None:
    """Checked before Spark starts (which takes seconds), each as one line."""
    from gateway.audit.layout import list_files
    from spark.dirs import audit_dirs
    from spark.times import parse_time

    if args.command == "demo":
        if next(iter(list_files(args.audit_dir, include_open=True)), None) is not None:
            return (f"cmq-audit demo: {args.audit_dir} already holds an audit log; a second demo would "
                    f"add to it: remove it or choose another --audit-dir")
        return None
    try:
        dirs = audit_dirs({"path": args.audit_dir})
    except ValueError as e:
        return f"cmq-audit report: --audit-dir {e}"
    for d in dirs:
        if not os.path.isdir(d):
            return f"cmq-audit report: --audit-dir {d}: no such directory"
    times = {}
    for flag, value in (("--from", args.start), ("--to", args.end)):
        if value is not None:
            try:
                times[flag] = parse_time(value)
            except ValueError as e:
                return f"cmq-audit report: {flag} {e}"
    if len(times) == 2 and times["--from"] >= times["--to"]:
        return f"cmq-audit report: --from {args.start} is not before --to {args.end}"
    return None


def _missing_extra() -> str | None:
    """The one line to print when the Spark extra is not installed (the base install lacks it)."""
    import importlib.util

    missing = [m for m in ("pyspark", "pyarrow", "pandas", "matplotlib") if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (f"cmq-audit: {', '.join(missing)} not installed: install the Spark extra with "
            f"pip install 'cmq-gateway[spark]' (from a checkout: pip install '.[spark]')")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = _bad_input(args) or (_missing_extra() if args.command == "report" else None)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.command == "demo":
        from spark.demo import write_demo_log

        n = write_demo_log(args.audit_dir, args.messages)
        print(f"wrote {n:,} records to {args.audit_dir}")
        return 0
    from spark.report import write_report

    spark = _session(args.master)
    try:
        write_report(spark, args.audit_dir, args.out, start=args.start, end=args.end)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
