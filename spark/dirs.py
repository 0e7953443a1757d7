"""Which audit directories a read covers: one per gateway, named by the ``path`` / ``paths``
options or the command line's ``--audit-dir``.  Standard library only, so the command line can
check them before it starts Spark."""

from __future__ import annotations

import glob
import json
import os

__all__ = ["audit_dirs"]


def audit_dirs(options: dict[str, str]) -> list[str]:
    """The audit directories of ``path`` / ``paths`` (``load([...])`` passes a JSON list as
    ``paths``), globs expanded in sorted order, each directory once."""
    given: list[str] = []
    paths = options.get("paths")
    if paths:
        given += json.loads(paths) if paths.lstrip().startswith("[") else paths.split(",")
    if options.get("path"):
        given += options["path"].split(",")
    out: list[str] = []
    seen: set[str] = set()
    for spec in (p.strip() for p in given):
        if not spec:
            continue
        if glob.has_magic(spec):
            found = sorted(d for d in glob.glob(spec) if os.path.isdir(d))
            if not found:
                raise ValueError(f"cmq-audit: no directory matches {spec!r}")
        else:
            found = [spec]
        for d in found:
            real = os.path.realpath(d)
            if real not in seen:
                seen.add(real)
                out.append(d)
    if not out:
        raise ValueError("cmq-audit: give the audit directory: .load(DIR) or .option('path', DIR)")
    return out
