"""``cmq-audit``: reports over the gateway's audit log.

    cmq-audit report --audit-dir DIR[,DIR...] --out DIR [--from T --to T] [--master URL] [--verbose]
    cmq-audit compact DIR [--remove]                 # closed segments to Parquet, by hand (A7)
    cmq-audit demo --audit-dir DIR [--messages N]     # a plausible log to try the report on
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gateway import version
from spark import class_archive

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
    rep.add_argument("--verbose", action="store_true",
                     help="Spark's own messages on stderr (else they go to OUT/spark.log)")
    comp = sub.add_parser("compact", help="compact the closed segments of an audit directory to Parquet (A7)")
    comp.add_argument("directory", metavar="DIR", help="an audit directory (older gateways' logs too)")
    comp.add_argument("--remove", action="store_true",
                      help="delete each JSON-lines segment once its Parquet file is durable (default: keep it)")
    demo = sub.add_parser("demo", help="write a synthetic audit log to try the report on")
    demo.add_argument("--audit-dir", required=True, metavar="DIR")
    demo.add_argument("--messages", type=int, default=20_000)
    return parser


def _session(master: str | None, log_path: str | None):  # type: ignore[no-untyped-def]
    """The report's SparkSession, and what to call with it once it is stopped (see
    spark.class_archive).  ``log_path``: where the JVM's (and its Python workers')
    stderr goes instead of the terminal (None: the terminal, ``--verbose``)."""
    # Executors must run this interpreter (it has pyarrow and this package) unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    # Spark's console progress bars would mix into the report's one-line-per-step progress; the
    # web UI is not looked at during a report and costs start-up time.
    builder = (SparkSession.builder.appName("cmq-audit report").config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false").config("spark.ui.enabled", "false"))
    launched = not os.environ.get("PYSPARK_GATEWAY_PORT")  # under spark-submit its JVM is running
    local = not master and launched  # spark-submit sets the master
    java_options: list[str] = []
    finish: Callable[[Any], None] = class_archive.nothing
    archive = ""
    if launched:
        archive, finish = class_archive.java_options()
        if archive:
            java_options.append(archive)
    if master:
        builder = builder.master(master)
    elif local:
        builder = builder.master("local[*]")
    if local or (master or "").startswith("local"):
        # Every result of the report is small: 200 shuffle partitions (the default) made each
        # of its aggregations 200 tasks, most of the run on a small log.
        builder = builder.config("spark.sql.shuffle.partitions", str(max(2, 2 * (os.cpu_count() or 1))))
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else a warning when the host name is loopback
        # A report is a short run of many small jobs: the JVM's second JIT tier spent more CPU
        # compiling than it saved (175 records: 57 s -> 23-39 s on the shared 2 cores).
        java_options.append("-XX:TieredStopAtLevel=1")
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
    try:
        return _start(builder, log_path), finish
    except Exception:
        if not archive.startswith("-XX:SharedArchiveFile"):
            raise
    # A JVM that cannot map the archive (damaged since it was recorded) dies at start: start
    # once more without it, and record a new one next time.
    class_archive.discard()
    java_options.remove(archive)
    builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
    return _start(builder, log_path, fresh=False), class_archive.nothing


def _start(builder: Any, log_path: str | None, fresh: bool = True) -> Any:
    if log_path is None:
        return builder.getOrCreate()
    # The JVM inherits this process's stdout and stderr when it starts and writes its warnings
    # (and a crash's report) there for its whole life, and so do its Python workers: point
    # them at the log file meanwhile.
    saved = [os.dup(1), os.dup(2)]
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if fresh else os.O_APPEND), 0o644)
    try:
        sys.stdout.flush()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        return builder.getOrCreate()
    finally:
        for fd, was in zip((1, 2), saved, strict=True):
            os.dup2(was, fd)
            os.close(was)
        os.close(log_fd)


def _bad_input(args: argparse.Namespace) -> str | None:
    """Checked before Spark starts (which takes seconds), each as one line."""
    from gateway.audit.layout import list_files
    from spark.dirs import audit_dirs
    from spark.times import parse_time

    if args.command == "compact":
        return None if os.path.isdir(args.directory) else f"cmq-audit compact: {args.directory}: no such directory"
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
    if args.command == "compact":
        from gateway.audit import compact

        return compact.main([args.directory, "--remove" if args.remove else "--keep"])
    if args.command == "demo":
        from spark.demo import write_demo_log

        n = write_demo_log(args.audit_dir, args.messages)
        print(f"wrote {n:,} records to {args.audit_dir}")
        return 0
    from spark.report import write_report

    os.makedirs(args.out, exist_ok=True)
    log_path = None if args.verbose else os.path.join(args.out, "spark.log")
    spark, finish = _session(args.master, log_path)
    try:
        write_report(spark, args.audit_dir, args.out, start=args.start, end=args.end)
    except Exception:
        if log_path:
            print(f"cmq-audit report: Spark's messages are in {log_path}", file=sys.stderr)
        raise
    finally:
        spark.stop()
        finish(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
