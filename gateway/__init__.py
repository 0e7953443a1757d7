"""The AMQP 0-9-1 server that maps RabbitMQ clients onto the CMQ model."""

from importlib import metadata

__all__ = ["version"]


def version() -> str:
    """The installed package's version (``cmq-gateway --version``, ``cmq-audit --version``, the
    server properties); 0.0.0 when run from a checkout that was never installed."""
    try:
        return metadata.version("cmq-gateway")
    except metadata.PackageNotFoundError:
        return "0.0.0"
