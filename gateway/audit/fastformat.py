"""The broker's rows formatted and counted in C, where the package was built with a compiler.

``format_rows(items, start, max_bytes, pending) -> (data, lines, stop, first_ts, why)``:
``items[start:stop]`` (rows of gateway.audit.rows, ``(time, row id, vhost, values)``) as their
JSON lines, all in one hour's folder and about ``max_bytes`` at most, each row counted into
``pending[(row id, vhost, row.pick(values))]`` as ``AuditLog._format_each`` counts it;
``first_ts`` is the first line's timestamp (None when ``lines`` is 0). ``why`` says where it
stopped: ``END`` (the end of ``items``), ``FULL`` (``max_bytes``), ``HOUR`` (``items[stop]`` is
of another hour) or ``PYTHON`` (``items[stop]`` is for the Python path: a dict record, a value
of another type than its schema's, a string UTF-8 cannot take, a timestamp field).

``Records(plain)``: the event loop's records packed as they are emitted, for the writer
process (``add(row_id, vhost, values)`` stamps a row with time.time's clock; ``add_item(marshal
of an item)``; ``len()``; ``take()`` the bytes), and ``unpack(data)``, the items again: at each
hand-off the loop marshalled the queued tuples (~0.3 us a record with the tuple and the
clock() call; 0.12 packed). A value it cannot pack goes as marshal of ``plain(value)``.

Why C: the writer process formatted 4 records a message in scenario 1 at ~2.6 us a record
(gateway.audit.batch), 10.6-12.4 us of CPU a message on the two cores the event loop and the
load generator share (docs/BENCHMARKS.md). ``gateway/audit/_format.c`` is compiled where the
package was built with a C compiler; ``format_rows`` is None otherwise, or when
``CMQ_GATEWAY_PURE_PYTHON=1`` is set, and the writer formats in Python
(``gateway.audit.batch`` and ``AuditLog._format_each``: the reference). ``COMPILED`` says which.
tests/unit/audit/test_format_c.py holds the two to the same bytes and counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.audit.record import _KEY, SCHEMA_VERSION, _esc, _written, format_ts
from gateway.audit.rows import ROWS, Row
from gateway.purepython import pure_python

__all__ = ["COMPILED", "END", "FULL", "HOUR", "PYTHON", "Records", "format_rows", "row_specs", "unpack"]

END, FULL, HOUR, PYTHON = range(4)
_ANY = -1  # a value json writes as it is (a boolean; a key outside the schema)


def row_specs(rows: list[Row]) -> list[tuple[bytes, int, tuple[tuple[int, bytes, int], ...], tuple[int, ...]]]:
    """What ``_format.configure`` takes of each row: the literal text after the timestamp up
    to the vhost's value, the number of values, each written key's (value index, ``,"key":``,
    kind) as ``record.formatter`` writes them, and the indices ``row.pick`` reads."""
    specs = []
    for row in rows:
        args = [str(i) for i in range(len(row.keys))]
        keys = tuple((int(arg), (_KEY[key] if key in _KEY else f",{_esc(key)}:").encode(),
                      _ANY if kind is None else kind)
                     for arg, key, kind in _written(args, row.keys))
        head = ('Z","event":' + _esc(row.event) + ',"vhost":').encode()
        specs.append((head, len(row.keys), keys, row.pick_indices))
    return specs


def _prefix_of(sec: int) -> str:
    return format_ts(sec)[:20]  # "YYYY-MM-DDTHH:MM:SS."


format_rows: Callable[[list[Any], int, int, dict[Any, int]], tuple[bytes, int, int, str | None, int]] | None = None
Records: Callable[[Callable[[Any], Any]], Any] | None = None
unpack: Callable[[bytes], list[Any]] | None = None
COMPILED = False

if not pure_python():
    try:
        from gateway.audit import _format  # type: ignore[attr-defined]
    except ImportError:  # built without a C compiler: the Python path, same bytes
        pass
    else:
        _format.configure(f'{{"v":{SCHEMA_VERSION},"ts":"'.encode(), row_specs(ROWS), _prefix_of)
        format_rows = _format.format_rows
        Records = _format.Records
        unpack = _format.unpack
        COMPILED = True
