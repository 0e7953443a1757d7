"""The operator's window: RabbitMQ's management HTTP API and CMQ views (SPEC M1, D7, D9, W5).

``await start_management(gateway_or_broker, host, port)`` serves it in the broker's event loop
and returns the aiohttp runner (``runner.addresses[0][1]`` is the port; ``await
runner.cleanup()`` stops it). See ``rabbit_api`` (RabbitMQ's paths and shapes), ``cmq_api``
(``/api/cmq/...``) and ``openapi`` (its OpenAPI 3 description).
"""

from gateway.management.app import Management, make_app, start_management

__all__ = ["Management", "make_app", "start_management"]
