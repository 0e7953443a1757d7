"""The MQTT listener of one gateway (SPEC MQ1): its sessions by (vhost, client id), retained
messages, and the asyncio server. Started by ``gateway.server.Gateway`` when ``mqtt_port``
is set."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from gateway.mqtt.retained import RetainedStore
from gateway.mqtt.session import SessionState, session_key

__all__ = ["MQTTService"]


class MQTTService:
    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.max_packet_size: int = gw.config.mqtt_max_packet_size
        self.sessions: dict[tuple[str, str], SessionState] = {}
        self.retained = RetainedStore(gw.broker)
        self.address: tuple[str, int] = ("", 0)

    async def serve(self, sock: socket.socket) -> asyncio.AbstractServer:
        from gateway.mqtt.transport import MQTTConnection

        self.address = sock.getsockname()[:2]
        return await asyncio.get_running_loop().create_server(lambda: MQTTConnection(self), sock=sock)

    @property
    def port(self) -> int:
        return self.address[1]

    def stored_session(self, vhost: str, client_id: str) -> SessionState | None:
        """A persistent session from before a restart (MQ3)."""
        raw = self.gw.broker.store.get(session_key(vhost, client_id))
        return None if raw is None else SessionState.from_json(raw)

    def forget(self, state: SessionState) -> None:
        self.sessions.pop((state.vhost, state.client_id), None)
        self.gw.broker.unpersist(session_key(state.vhost, state.client_id))
