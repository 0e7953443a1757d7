"""Reading the times users type (``from`` / ``to``): standard library only, so the command line
can check them before it starts Spark."""

from __future__ import annotations

import datetime as _dt

__all__ = ["parse_time"]


def parse_time(text: str) -> _dt.datetime:
    """Unix seconds or ISO-8601 (``Z`` or an offset; naive means UTC) as an aware datetime.
    Raises ValueError naming what is accepted."""
    try:
        return _dt.datetime.fromtimestamp(float(text), _dt.UTC)
    except ValueError:
        pass
    try:
        t = _dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time: give ISO-8601 UTC (2026-11-21T00:00:00Z) "
                         f"or Unix seconds") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=_dt.UTC)
