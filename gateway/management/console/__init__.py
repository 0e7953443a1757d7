"""The management web console (SPEC UI1-UI3): static files served at ``/`` by the
management listener; see :mod:`gateway.management.console.console`."""

from gateway.management.console.console import add_routes

__all__ = ["add_routes"]
