"""One version story (issue 30): the gateway reports, in /api/overview and in a definitions
export, the RabbitMQ release it answers as, and that is the release its differential tests
run against (the RabbitMQ on this machine)."""

from __future__ import annotations

import pytest

from tests.integration.test_management_rabbitmq import Side, sides  # noqa: F401 - the fixture

pytestmark = pytest.mark.rabbitmq


async def test_the_gateway_reports_the_rabbitmq_release_it_is_compared_with(sides: tuple[Side, Side]) -> None:  # noqa: F811
    rabbit, gateway = sides
    theirs = await rabbit.get("/api/overview")
    ours = await gateway.get("/api/overview")
    assert ours["rabbitmq_version"].split(".")[:2] == theirs["rabbitmq_version"].split(".")[:2]
    assert ours["management_version"] == ours["rabbitmq_version"]
    exported = await gateway.get("/api/definitions")
    assert exported["rabbit_version"] == exported["rabbitmq_version"] == ours["rabbitmq_version"]
    assert ours["product_name"] == "cmq-gateway"
