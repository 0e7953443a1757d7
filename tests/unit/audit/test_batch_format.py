"""A1/A2: the writer's batch path (gateway.audit.batch) writes byte for byte the files and
counts of the record-by-record path: over generated batches of rows (every shape, None
fields, unusual types, escapes, several vhosts, runs across seconds and the rounding carry
into the next second, file rotation), and it is the path scenario 1's rows take where the C
formatter is not built (tests/unit/audit/test_format_c.py holds that one to the same bytes)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.audit.batch import format_run, second_runs
from gateway.audit.compact import MODE_ENV
from gateway.audit.record import FIELD_TYPES
from gateway.audit.rows import ROUTE, ROWS
from gateway.audit.writer import AuditLog
from tests.unit.audit.format_cases import BASE, scenario_1, written


@pytest.fixture(autouse=True, scope="module")
def _no_compactor() -> Any:
    """The files are compared as written: a compactor started at each rotation (600 of them,
    each loading pyarrow, in one run of the property below) tested nothing here and held the
    machine's two cores for minutes."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MODE_ENV, "off")
        yield

_text = st.one_of(st.sampled_from(["guest", "perf-q", "127.0.0.1:5000", "a%sb", "%d", ""]),
                  st.text(st.characters(blacklist_categories=("Cs",)), max_size=8))
_int = st.one_of(st.integers(0, 2**20), st.integers(-(2**70), 2**70), st.booleans())
_float = st.one_of(st.floats(-1e6, 1e6), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, 1e-5, 1e16, 0.001]))
_VALUE = {
    "string": st.one_of(st.none(), _text, st.integers(-5, 5)),
    "long": st.one_of(st.none(), _int),
    "int": st.one_of(st.none(), _int),
    "double": st.one_of(st.none(), _float, st.integers(-5, 5)),
    "array<string>": st.one_of(st.none(), st.lists(st.one_of(_text, st.integers()), max_size=3)),
    "timestamp": st.one_of(st.none(), st.floats(0, 4e9)),
    "boolean": st.one_of(st.none(), st.booleans(), st.integers(0, 1)),
}
# Mostly the same few values per column (as the broker's are), sometimes anything.
_COMMON = {"string": st.sampled_from(["guest", "perf-q", "msg-1", "msg-2"]),
           "long": st.sampled_from([16, 1024]), "int": st.sampled_from([1, 2]),
           "double": st.sampled_from([0.5, 12.25]), "array<string>": st.sampled_from([["a", "b"], []]),
           "timestamp": st.just(None), "boolean": st.sampled_from([True, None])}
_BASE = BASE


@st.composite
def _items(draw: st.DrawFn) -> list[tuple[float, int, str, tuple[Any, ...]]]:
    rows = draw(st.lists(st.sampled_from(ROWS), min_size=1, max_size=3, unique=True))
    vhosts = draw(st.lists(st.sampled_from(["/", "v%", 'q"h', "é"]), min_size=1, max_size=2, unique=True))
    odd = draw(st.booleans())  # values of any type, or the broker's usual ones
    t = _BASE + draw(st.sampled_from([0.0, 0.9999, 0.9999995]))
    out = []
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.0, 1e-6, 3e-7, 0.01, 0.6]))
        row = draw(st.sampled_from(rows))
        kinds = [FIELD_TYPES[k] for k in row.keys]
        values = tuple(draw((_VALUE if odd else _COMMON)[k]) for k in kinds)
        out.append((t, row.id, draw(st.sampled_from(vhosts)), values))
    return out


def _written(directory: str, items: list[Any], fast: bool, rotate_bytes: int, cut: int) -> Any:
    def fmt_of(log: AuditLog) -> Any:
        log._format_rows = None  # the Python batch path, whether or not the C one is built
        return log._format if fast else log._format_each
    return written(directory, items, rotate_bytes, cut, fmt_of)


@settings(max_examples=300, deadline=None)
@given(_items(), st.sampled_from([64 * 1024 * 1024, 700, 150]), st.integers(0, 3))
def test_A2_batches_are_written_as_record_by_record(tmp_path_factory: Any, items: list[Any],
                                                     rotate_bytes: int, cut: int) -> None:
    fast = _written(str(tmp_path_factory.mktemp("fast")), items, True, rotate_bytes, cut)
    each = _written(str(tmp_path_factory.mktemp("each")), items, False, rotate_bytes, cut)
    assert fast == each


def test_A1_scenario_1_rows_take_the_batch_path_with_exact_counts() -> None:
    items = scenario_1(500, _BASE + 0.25)
    assert second_runs([it[0] for it in items]) == [(0, 2000, int(_BASE))]
    got = format_run(items, int(_BASE))
    assert got is not None
    data, ts, counts = got
    lines = data.splitlines()
    assert len(lines) == 2000 and ts == "2026-09-21T14:13:20.250000Z"
    assert lines[1] == (b'{"v":2,"ts":"2026-09-21T14:13:20.250001Z","event":"enqueue","vhost":"/",'
                        b'"queue":"perf-q","msg_id":"msg-0000000000000000","size":16}')
    assert sorted(counts) == sorted([(("publish", "/", ""), 500), (("enqueue", "/", "perf-q", True), 500),
                                     (("deliver", "/", "perf-q", False), 500), (("ack", "/", "perf-q"), 500)])


def test_A2_a_route_row_s_tags_take_the_batch_path() -> None:
    values = ("ex", "msg-1", "a.b", "ex->s", "q", ["eu", "vip"], 16)
    got = format_run([(_BASE + 0.5, ROUTE.id, "/", values), (_BASE + 0.6, ROUTE.id, "/", values)], int(_BASE))
    assert got is not None
    assert got[0].splitlines()[0].endswith(b'"queue":"q","tags":["eu","vip"],"size":16}')


def test_A2_a_clock_stepping_back_is_not_a_run() -> None:
    assert second_runs([_BASE + 1.5, _BASE + 0.5]) is None
    assert second_runs([_BASE + 0.5, _BASE + 1.5, _BASE + 1.7]) == [(0, 1, int(_BASE)), (1, 3, int(_BASE) + 1)]
