"""The report's JVM started from an archive of the classes an earlier report loaded (the JDK's
application class-data sharing, AppCDS).

A report on a small log is mostly a JVM starting and then loading, parsing and verifying
Spark's classes for its first jobs, in both cases before any record is read. The JDK can map
the classes a previous run loaded from an archive instead. The first report on a machine
records that archive as its JVM exits (which costs that one report a few seconds); each later
one starts from it.

The archive is one file per Java binary and PySpark install (the key of its name), under the
user's cache directory, so an upgrade of either records a new one. A JVM that cannot use an
archive (another JDK build, a damaged or partly written file) starts as it would without one:
``-Xshare:auto`` is the JDK's default, and the archive's messages are turned off because a
fallback is not the user's concern. ``CMQ_AUDIT_CLASS_ARCHIVE=off`` turns the whole thing off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ENV = "CMQ_AUDIT_CLASS_ARCHIVE"
# The JDK's own messages about the archive (classes it skips while recording, an archive it
# cannot map) are for whoever tunes the JVM, not for a report's reader.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java() -> str | None:
    """The java binary spark-submit will run (``$JAVA_HOME/bin/java``, else the PATH's)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def archive_path() -> Path | None:
    """Where this machine's archive for this Java and this PySpark lives (None: turned off,
    or no java to key it by)."""
    if os.environ.get(_ENV, "").lower() in ("off", "0", "no", "false"):
        return None
    java = _java()
    if java is None:
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    names = sorted(os.listdir(jars)) if jars.is_dir() else []
    key = hashlib.sha256("\0".join([java, str(os.stat(java).st_mtime_ns), pyspark.__version__,
                                    str(jars), *names]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "cmq-audit" / f"spark-classes-{key}.jsa"


def java_options() -> tuple[str, Callable[[Any], None]]:
    """The JVM options to add to the driver's, and what to call with the session once it is
    stopped: nothing when the archive is there; else the JVM is told to record it at exit,
    and the call ends the JVM and puts the recorded file in place."""
    path = archive_path()
    if path is None:
        return "", nothing
    if path.is_file():
        # Should the file be damaged after all, the JVM's crash report goes where Spark's own
        # messages go, and its hs_err file into the cache, not the user's working directory.
        crash = f"-XX:ErrorFile={path.parent}/hs_err_pid%p.log"
        return f"-XX:SharedArchiveFile={path} {crash} {_QUIET}", nothing
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: no archive, a start as before
        return "", nothing
    # Recorded under a name of this process's own, and renamed only once the JVM has exited
    # (so written whole): two first reports at once each record their own, and a third
    # never maps a file still being written.
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")

    def finish(session: Any) -> None:
        proc = getattr(getattr(session.sparkContext, "_gateway", None), "proc", None)
        if proc is None:
            return
        print("cmq-audit: keeping Spark's classes for a faster start next time (once)", file=sys.stderr, flush=True)
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # PySpark's JVM exits at the end of its stdin
            if proc.wait(timeout=120) == 0 and _whole(partial):
                os.replace(partial, path)
        except Exception:  # an archive is a speed-up only: never the report's failure
            pass
        finally:
            if partial.exists():
                partial.unlink(missing_ok=True)

    return f"-XX:ArchiveClassesAtExit={partial} {_QUIET}", finish


def _whole(archive: Path) -> bool:
    """Whether a JVM can map ``archive``: a JVM that maps a truncated one dies of SIGBUS
    rather than falling back, so a file a full disk cut short must never be put in place."""
    java = _java()
    if java is None or not archive.is_file() or archive.stat().st_size == 0:
        return False
    run = subprocess.run([java, f"-XX:SharedArchiveFile={archive}", "-Xlog:disable", "-version"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
    return run.returncode == 0


def discard() -> None:
    """Remove this machine's archive (a JVM could not start from it)."""
    path = archive_path()
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def nothing(session: Any) -> None:
    """No archive to record."""
