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

A user's own session can start from the same archive (``session_builder``): a new JVM's session
start, its first DataFrame and its first query all load classes, whichever reader it uses.
"""

from __future__ import annotations

import atexit
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
_recording: set[Path] = set()  # partial archives this process records at its exit


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


def _plan() -> tuple[str, tuple[Path, Path] | None]:
    """The JVM options to add to the driver's, and (partial file, archive) when this JVM is
    to record the archive as it exits (there is none yet)."""
    path = archive_path()
    if path is None:
        return "", None
    if path.is_file():
        # Should the file be damaged after all, the JVM's crash report goes where Spark's own
        # messages go, and its hs_err file into the cache, not the user's working directory.
        crash = f"-XX:ErrorFile={path.parent}/hs_err_pid%p.log"
        return f"-XX:SharedArchiveFile={path} {crash} {_QUIET}", None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: no archive, a start as before
        return "", None
    # Recorded under a name of this process's own, and renamed only once the JVM has exited
    # (so written whole): two first reports at once each record their own, and a third
    # never maps a file still being written.
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    return f"-XX:ArchiveClassesAtExit={partial} {_QUIET}", (partial, path)


def java_options() -> tuple[str, Callable[[Any], None]]:
    """The JVM options to add to the driver's, and what to call with the session once it is
    stopped: nothing when the archive is there; else the JVM is told to record it at exit,
    and the call ends the JVM and puts the recorded file in place."""
    options, recording = _plan()
    if recording is None:
        return options, nothing

    def finish(session: Any) -> None:
        _record(getattr(getattr(session.sparkContext, "_gateway", None), "proc", None), *recording)

    return options, finish


def session_builder(builder: Any = None, extra_java_options: str = "") -> Any:
    """``SparkSession.builder`` (or ``builder``) with the driver's JVM started from this
    machine's class archive, the one ``cmq-audit report`` uses::

        from spark.class_archive import session_builder
        spark = session_builder().master("local[*]").getOrCreate()

    The first session on a machine records the archive as its JVM exits, at the end of this
    Python process (a few seconds more, once, with one line on stderr); each later one starts
    from it: session start, the first DataFrame and the first query load fewer classes,
    whichever reader they use.  Only a JVM this process starts takes JVM options (not under
    ``spark-submit``, nor once a session is running), and only the driver's (in local mode,
    the executors are in it).  ``extra_java_options``: the caller's own driver JVM options, kept
    (``spark.driver.extraJavaOptions`` set on the builder is replaced by these).
    ``CMQ_AUDIT_CLASS_ARCHIVE=off`` turns it off.  An archive this JVM cannot map (another
    JDK build, other jars on the class path) is ignored by the JVM; one cut short, which a
    JVM cannot survive, is checked for before it is used and recorded anew."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    out = SparkSession.builder if builder is None else builder
    options, recording = "", None
    if not os.environ.get("PYSPARK_GATEWAY_PORT") and SparkContext._gateway is None:
        path = archive_path()
        if path is not None and path.is_file() and not _checked(path):
            discard()
        options, recording = _plan()
    if recording is not None and recording[0] not in _recording:  # a second builder before the JVM starts
        _recording.add(recording[0])
        atexit.register(_record_at_exit, *recording)
    joined = " ".join(o for o in (options, extra_java_options) if o)
    return out.config("spark.driver.extraJavaOptions", joined) if joined else out


def _checked(archive: Path) -> bool:
    """Whether ``archive`` is whole: mapped once by a JVM (``_whole``, 0.1-0.3 s), then
    known by its size and mtime in a file beside it, so later sessions only stat it."""
    mark = archive.with_name(archive.name + ".ok")
    st = archive.stat()
    seen = f"{st.st_size} {st.st_mtime_ns}"
    with contextlib.suppress(OSError):
        if mark.read_text() == seen:
            return True
    if not _whole(archive):
        return False
    with contextlib.suppress(OSError):
        mark.write_text(seen)
    return True


def _record_at_exit(partial: Path, path: Path) -> None:
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    # Only the JVM started with this recording's options (a session made otherwise first
    # started one without them).
    if proc is not None and str(partial) in " ".join(map(str, getattr(proc, "args", ()))):
        _record(proc, partial, path)


def _record(proc: Any, partial: Path, path: Path) -> None:
    """End PySpark's JVM ``proc`` (it records ``partial`` as it exits) and put the archive in
    place, whole; a speed-up only, so never anyone's failure."""
    if proc is None:
        return
    print("cmq-audit: keeping Spark's classes for a faster start next time (once)", file=sys.stderr, flush=True)
    try:
        if proc.stdin is not None:
            proc.stdin.close()  # PySpark's JVM exits at the end of its stdin
        if proc.wait(timeout=120) == 0 and _whole(partial):
            os.replace(partial, path)
    except Exception:  # an archive is a speed-up only
        pass
    finally:
        if partial.exists():
            partial.unlink(missing_ok=True)


def _whole(archive: Path) -> bool:
    """Whether a JVM can map ``archive``: a JVM that maps a truncated one dies of SIGBUS
    rather than falling back, so a file a full disk cut short must never be put in place."""
    java = _java()
    if java is None or not archive.is_file() or archive.stat().st_size == 0:
        return False
    # The crash this check exists for is expected: its report goes nowhere (not into the
    # user's working directory, where a JVM writes hs_err_pid*.log by default), no core dump.
    run = subprocess.run([java, f"-XX:SharedArchiveFile={archive}", "-Xlog:disable", "-XX:ErrorFile=/dev/null",
                          "-XX:-CreateCoredumpOnCrash", "-version"],
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
