"""A1/A2: the audit writer's rows formatted and counted in C (gateway/audit/_format.c, through
gateway.audit.fastformat) give byte for byte the files and counts of the Python path, the
reference (``AuditLog._format_each``; and the Python batch path): over generated batches of
every row shape with values of any type (unicode, escapes and control characters, lone
surrogates, ints past 64 bits, None, floats with their exponents, NaN and infinities, lists
of strings and of other things), dict records between the rows, clocks stepping back, runs
across hours and the rounding carry into the next second, and file rotation. Where the module
is not built (no C compiler) there is nothing to compare and these tests are skipped; the
Python path runs and test_batch_format.py holds it to the reference."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.audit import fastformat
from gateway.audit.compact import MODE_ENV
from gateway.audit.record import FIELD_TYPES
from gateway.audit.rows import ACK, DELIVER, ENQUEUE, PUBLISH_QUEUE, ROWS
from gateway.audit.writer import AuditLog, _plain
from tests.unit.audit.format_cases import BASE, scenario_1, written

pytestmark = pytest.mark.skipif(not fastformat.COMPILED, reason="gateway.audit._format is not built")


@pytest.fixture(autouse=True, scope="module")
def _no_compactor() -> Any:
    """The files are compared as written (a compactor at each rotation tests nothing here)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MODE_ENV, "off")
        yield


_text = st.one_of(st.sampled_from(["guest", "perf-q", "127.0.0.1:5000", "", 'q"\\', "\x00\x1f\x7f", "\u2028é日"]),
                  st.text(max_size=8))  # lone surrogates included
_int = st.one_of(st.integers(0, 2**20), st.integers(-(2**70), 2**70), st.integers(-(2**64), 2**64), st.booleans())
_float = st.one_of(st.floats(-1e6, 1e6), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, 1e-5, 1e16, 0.001, 1e300, 5e-324]))
_other = st.one_of(st.none(), _text, _int, _float, st.lists(_text, max_size=3), st.tuples(_text),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_VALUE = {
    "string": st.one_of(st.none(), _text, st.integers(-5, 5), _other),
    "long": st.one_of(st.none(), _int, _other),
    "int": st.one_of(st.none(), _int),
    "double": st.one_of(st.none(), _float, st.integers(-5, 5)),
    "array<string>": st.one_of(st.none(), st.lists(st.one_of(_text, st.integers()), max_size=3),
                               st.tuples(_text, _text), st.lists(st.lists(_text, max_size=2), max_size=2)),
    "timestamp": st.one_of(st.none(), st.floats(0, 4e9)),
    "boolean": st.one_of(st.none(), st.booleans(), st.integers(0, 1), _other),
}
_COMMON = {"string": st.sampled_from(["guest", "perf-q", "msg-1", "msg-2"]),
           "long": st.sampled_from([16, 1024]), "int": st.sampled_from([1, 2]),
           "double": st.sampled_from([0.5, 12.25, 1.234]), "array<string>": st.sampled_from([["a", "b"], []]),
           "timestamp": st.just(None), "boolean": st.sampled_from([True, False, None])}


@st.composite
def _items(draw: st.DrawFn) -> list[Any]:
    rows = draw(st.lists(st.sampled_from(ROWS), min_size=1, max_size=4, unique=True))
    vhosts = draw(st.lists(st.sampled_from(["/", "v%", 'q"h', "é", "\ud800"]), min_size=1, max_size=2, unique=True))
    odd = draw(st.booleans())
    t = BASE + draw(st.sampled_from([0.0, 0.9999, 0.9999995, 2799.9999]))  # 2800: the next hour
    out: list[Any] = []
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.0, 1e-6, 3e-7, 0.01, 0.6, -0.3, 1800.0]))
        what = draw(st.integers(0, 19))
        if what == 0:  # a dict record between the rows
            out.append((t, draw(st.sampled_from(["connection_open", "queue_declare", "publish"])),
                        draw(st.sampled_from(vhosts)), {"user": draw(_text), "size": draw(_int)}))
            continue
        row = draw(st.sampled_from(rows))
        kinds = [FIELD_TYPES[k] for k in row.keys]
        values = tuple(draw((_VALUE if odd else _COMMON)[k]) for k in kinds)
        if what == 1:  # not the row's length
            values = values[:-1]
        when: Any = t
        if what == 2:
            when = int(t)
        out.append((when, row.id, draw(st.sampled_from(vhosts)), values))
    return out


def _written(directory: str, items: list[Any], mode: str, rotate_bytes: int, cut: int) -> Any:
    def fmt_of(log: AuditLog) -> Any:
        assert log._format_rows is fastformat.format_rows is not None
        if mode != "c":
            log._format_rows = None
        return log._format_each if mode == "each" else log._format
    return written(directory, items, rotate_bytes, cut, fmt_of)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_items(), st.sampled_from([64 * 1024 * 1024, 700, 150]), st.integers(0, 3))
def test_A2_the_c_formatter_writes_as_the_python_path(tmp_path_factory: Any, items: list[Any],
                                                      rotate_bytes: int, cut: int) -> None:
    c = _written(str(tmp_path_factory.mktemp("c")), items, "c", rotate_bytes, cut)
    each = _written(str(tmp_path_factory.mktemp("each")), items, "each", rotate_bytes, cut)
    assert c[0] == each[0]
    if c[0] is None:  # after an error, what got counted before it depends on the path
        assert c == each
        assert c == _written(str(tmp_path_factory.mktemp("batch")), items, "batch", rotate_bytes, cut)


def test_A1_scenario_1_rows_are_all_formatted_in_c_with_exact_counts() -> None:
    items = scenario_1(500, BASE + 0.25)
    assert fastformat.format_rows is not None
    pending: dict[Any, int] = {}
    data, lines, stop, ts, why = fastformat.format_rows(items, 0, 1 << 30, pending)
    assert (lines, stop, why, ts) == (2000, 2000, fastformat.END, "2026-09-21T14:13:20.250000Z")
    assert data.splitlines()[1] == (b'{"v":2,"ts":"2026-09-21T14:13:20.250001Z","event":"enqueue","vhost":"/",'
                                    b'"queue":"perf-q","msg_id":"msg-0000000000000000","size":16}')
    assert pending == {(PUBLISH_QUEUE.id, "/", None): 500, (ENQUEUE.id, "/", ("perf-q", None)): 500,
                       (DELIVER.id, "/", ("perf-q", 1)): 500, (ACK.id, "/", "perf-q"): 500}


def test_A2_the_c_formatter_stops_at_another_hour_and_at_its_byte_bound() -> None:
    items = scenario_1(10, (BASE // 3600 + 1) * 3600 - 0.00005)  # the hour ends within the run
    assert fastformat.format_rows is not None
    data, lines, stop, ts, why = fastformat.format_rows(items, 0, 1 << 30, {})
    assert why == fastformat.HOUR and 0 < stop == lines < len(items)
    assert fastformat.format_rows(items, stop, 1 << 30, {})[4] == fastformat.END
    data, lines, stop, ts, why = fastformat.format_rows(scenario_1(10, BASE), 0, 1, {})
    assert (lines, stop, why) == (1, 1, fastformat.FULL)


def test_A2_pure_python_is_chosen_by_the_environment() -> None:
    env = dict(os.environ, CMQ_GATEWAY_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", "from gateway.audit import fastformat as f; print(f.COMPILED)"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _Odd:
    def __str__(self) -> str:
        return "odd"


_ANYVALUE = st.one_of(_other, st.booleans(), st.lists(_other, max_size=2), st.just(_Odd()))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.integers(0, len(ROWS) - 1), st.sampled_from(["/", "é", "\ud800", "v"]),
              st.lists(_ANYVALUE, max_size=9).map(tuple)),
    st.tuples(st.sampled_from(["connection_open", "queue_declare"]), st.just("/"),
              st.dictionaries(st.text(max_size=3), _ANYVALUE, max_size=3))), max_size=20))
def test_A1_packed_records_come_back_as_the_marshalled_items(records: list[Any]) -> None:
    """What the event loop packs (fastformat.Records) is what the writer process unpacks: the
    items marshal would have carried (a value marshal refuses, as plain() makes it), in
    order, stamped with time.time's clock."""
    assert fastformat.Records is not None and fastformat.unpack is not None
    packed = fastformat.Records(_plain)
    before = time.time()
    for key, vhost, values in records:
        if isinstance(key, int):
            packed.add(key, vhost, values)
        else:
            packed.add_item(marshal.dumps((before, key, vhost, _carried(values))))
    after = time.time()
    assert len(packed) == len(records)
    got = fastformat.unpack(packed.take())
    assert len(packed) == 0 and packed.take() == b""
    assert len(got) == len(records)
    for (t, key, vhost, values), (k, v, vals) in zip(got, records, strict=True):
        assert (key, vhost) == (k, v) and before <= t <= after
        expected = _carried(vals) if isinstance(k, str) else tuple(map(_carried, vals))
        assert repr(values) == repr(expected)  # repr: NaN is not equal to itself


def _carried(value: Any) -> Any:
    """A value as marshal carries it to the writer process, or as plain() makes it when
    marshal refuses it (the same as each value of a batch before: a row's values one by one)."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return marshal.loads(marshal.dumps(_plain(value)))


def test_A1_a_record_that_fails_to_pack_leaves_the_next_ones_whole() -> None:
    """A string repeated from the last record of its row is packed as a reference to it; a
    record that failed half-way (its plain() raised) is not in the batch, so what it held
    is not referred to afterwards."""
    assert fastformat.Records is not None and fastformat.unpack is not None

    def refuse(value: Any) -> Any:
        raise RuntimeError("no")

    packed = fastformat.Records(refuse)
    queue, user = "q-" + "x" * 3, "guest"
    packed.add(DELIVER.id, "/", (user, "peer", queue, "m-1", 1, 16))
    with pytest.raises(RuntimeError):
        packed.add(ACK.id, "/", (user, "peer", queue, "m-1", _Odd()))
    packed.add(ACK.id, "/", (user, "peer", queue, "m-1", 0.5))
    packed.add(ACK.id, "/", (user, "peer", queue, "m-2", 0.25))
    data = packed.take()
    got = [item[1:] for item in fastformat.unpack(data)]
    assert got == [(DELIVER.id, "/", (user, "peer", queue, "m-1", 1, 16)),
                   (ACK.id, "/", (user, "peer", queue, "m-1", 0.5)), (ACK.id, "/", (user, "peer", queue, "m-2", 0.25))]
    assert data.count(queue.encode()) == 2  # the deliver's and the first ack's; the second refers to it
