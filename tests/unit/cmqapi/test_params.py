"""CA2/CA3: CMQ's parameter forms: ``name.n`` lists from 0 or 1, consecutive, at most 16."""

from __future__ import annotations

import pytest

from gateway.cmqapi.errors import CmqApiError
from gateway.cmqapi.params import Params


def test_CA2_lists_start_at_0_or_1_and_keep_index_order() -> None:
    assert Params({"msgBody.1": "a", "msgBody.2": "b"}).indexed("msgBody") == ["a", "b"]
    assert Params({"msgBody.1": "b", "msgBody.0": "a"}).indexed("msgBody") == ["a", "b"]
    assert Params({"msgBody.10": "k", **{f"msgBody.{i}": str(i) for i in range(1, 10)}}).indexed("msgBody")[-1] == "k"
    assert Params({"msgBodyX.1": "a"}).indexed("msgBody") == []


@pytest.mark.parametrize("values", [{"msgBody.1": "a", "msgBody.3": "c"}, {"msgBody.2": "b"}])
def test_CA2_lists_must_be_consecutive(values: dict[str, str]) -> None:
    with pytest.raises(CmqApiError) as e:
        Params(values).indexed("msgBody")
    assert e.value.code == 4000 and e.value.message.startswith("(10380)")


def test_CA2_batch_of_17_refused() -> None:
    with pytest.raises(CmqApiError) as e:
        Params({f"msgBody.{i}": "x" for i in range(1, 18)}).bodies(batch=True)
    assert e.value.message.startswith("(10370)")
    assert len(Params({f"msgBody.{i}": "x" for i in range(1, 17)}).bodies(batch=True)) == 16


def test_CA1_integers_and_ranges() -> None:
    p = Params({"a": "12", "b": "x", "c": "99"})
    assert p.number("a", 0, 20) == 12
    assert p.number("missing", 0, 20, 7) == 7
    with pytest.raises(CmqApiError, match=r"\(10360\)"):
        p.number("b", 0, 20)
    with pytest.raises(CmqApiError, match=r"\(10350\)parameter c value or length is out of range"):
        p.number("c", 0, 20)
    with pytest.raises(CmqApiError, match=r"\(10390\)lacked of required parameter missing"):
        p.text("missing")


def test_CA2_page_filters_sorts_and_pages() -> None:
    names = ["b-q", "a-q", "c-x", "d-q"]
    assert Params({"searchWord": "-q"}).page(names) == (3, ["a-q", "b-q", "d-q"])
    assert Params({"searchWord": "-q", "offset": "1", "limit": "1"}).page(names) == (3, ["b-q"])
