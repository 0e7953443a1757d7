"""Filter pushdown for the ``cmq-audit`` batch reader (A4: prune by time).

Spark hands ``pushFilters`` the conjuncts of a query's WHERE clause; the ones taken here are
never evaluated by Spark again, so each is applied *exactly*:

* ``dt``, ``hour``: every row of a ``dt=…/hour=…`` folder has that value, so the folder is
  skipped or read whole (partition pruning, before any file is listed);
* ``file``: the same, per file;
* ``ts`` ranges: folders whose hour cannot hold a matching ``ts`` are skipped (the writer
  guarantees every record sits in its own UTC hour's folder), then rows are masked in Arrow;
* equality / IN on ``event``, ``vhost``, ``topic``, ``queue`` and the other string keys:
  masked in Arrow right after parsing, before rows cross into the JVM.

Anything else (OR, NOT, LIKE, other columns) is handed back to Spark unchanged, as the same
object.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Pushdown", "STRING_KEYS"]

STRING_KEYS = frozenset(
    {"event", "vhost", "topic", "queue", "subscription", "msg_id", "user", "peer", "reason",
     "routing_key", "policy", "conn"}
)
_FOLDER_KEYS = {"dt": str, "hour": int, "file": str}

_OPS: dict[type, str] = {
    EqualTo: "==", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<=",
    In: "in", IsNotNull: "notnull",
}
_HOUR = _dt.timedelta(hours=1)


def _holds(op: str, x: Any, v: Any) -> bool:
    if op == "==":
        return bool(x == v)
    if op == "in":
        return x in v
    if op == ">":
        return bool(x > v)
    if op == ">=":
        return bool(x >= v)
    if op == "<":
        return bool(x < v)
    if op == "<=":
        return bool(x <= v)
    return x is not None  # notnull


@dataclass
class Pushdown:
    """The accepted conditions, as plain picklable data: (column, op, value)."""

    conds: list[tuple[str, str, Any]] = field(default_factory=list)

    def offer(self, f: Filter) -> bool:
        """Take ``f`` if it can be applied exactly; False hands it back to Spark."""
        op = _OPS.get(type(f))
        attr: tuple[str, ...] = getattr(f, "attribute", ())
        if op is None or len(attr) != 1:
            return False
        col = attr[0]
        value: Any = getattr(f, "value", None)
        values = tuple(value) if op == "in" else (value,)
        if col in _FOLDER_KEYS:
            want = _FOLDER_KEYS[col]
            if op != "notnull" and not all(type(x) is want for x in values):
                return False
        elif col == "ts":
            if op == "in" or (op != "notnull" and not isinstance(value, _dt.datetime)):
                return False
            if op != "notnull" and value.tzinfo is None:
                return False  # cannot place a naive time on the UTC axis
        elif col in STRING_KEYS:
            if op not in ("==", "in", "notnull") or not all(
                op == "notnull" or isinstance(x, str) for x in values
            ):
                return False
        else:
            return False
        self.conds.append((col, op, frozenset(values) if op == "in" else value))
        return True

    @property
    def row_conds(self) -> list[tuple[str, str, Any]]:
        return [c for c in self.conds if c[0] not in _FOLDER_KEYS]

    def keep_folder(self, dt: str, hour: int) -> bool:
        start = _dt.datetime.fromisoformat(dt).replace(hour=hour, tzinfo=_dt.UTC)
        end = start + _HOUR  # the folder holds ts in [start, end)
        for col, op, v in self.conds:
            if col == "dt" and not _holds(op, dt, v):
                return False
            if col == "hour" and not _holds(op, hour, v):
                return False
            if col == "ts" and op != "notnull":
                if op in (">", ">=") and not end > v:
                    return False
                if op in ("<", "<=", "==") and not start <= v:
                    return False
                if op == "==" and not end > v:
                    return False
        return True

    def keep_file(self, key: str) -> bool:
        return all(_holds(op, key, v) for col, op, v in self.conds if col == "file")

    def mask(self, table: pa.Table) -> pa.Array | None:
        """Boolean mask of the rows that pass every row condition (None: keep all)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        mask = None
        for col, op, v in self.row_conds:
            c = table.column(col)
            if op == "notnull":
                m = pc.is_valid(c)
            elif op == "in":
                m = pc.is_in(c, value_set=pa.array(sorted(v), type=c.type))
            else:
                scalar = pa.scalar(v, type=c.type)
                fn = {"==": pc.equal, ">": pc.greater, ">=": pc.greater_equal, "<": pc.less,
                      "<=": pc.less_equal}[op]
                m = fn(c, scalar)
            m = pc.fill_null(m, False)  # SQL: a comparison with null is not true
            mask = m if mask is None else pc.and_(mask, m)
        return mask
