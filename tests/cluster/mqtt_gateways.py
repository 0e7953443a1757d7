"""Gateway processes that also serve MQTT (``--mqtt-port``), for the cluster MQTT tests, and a
small synchronous paho-mqtt client around them.

    gw = MQTTGateway(tmp_path, "gw1", store=cluster.store_url).start()
    gw.mqtt_port      # the MQTT listener, kept over a restart as the AMQP port is
"""

from __future__ import annotations

import queue
import re
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.support.gateway_procs import GatewayProcess

MQTT_LINE = re.compile(r"cmq-gateway: MQTT on (?:127\.0\.0\.1|0\.0\.0\.0):(\d+)")


class MQTTGateway(GatewayProcess):
    def __init__(self, root: Path | str, name: str, store: str | None = None, **kwargs: Any) -> None:
        super().__init__(root, name, store, **kwargs)
        self.mqtt_port = 0

    def command(self) -> list[str]:
        cmd = super().command()
        i = cmd.index("--mqtt-port")
        cmd[i + 1] = str(self.mqtt_port)
        return cmd

    def start(self, timeout: float = 120.0) -> MQTTGateway:
        super().start(timeout)
        deadline = time.monotonic() + 10
        while True:
            found = MQTT_LINE.findall(self.log.read_text(errors="replace"))
            if found:
                self.mqtt_port = int(found[-1])
                return self
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} printed no MQTT port:\n{self.log_tail()}")
            time.sleep(0.05)


class Device:
    """A paho-mqtt client (its own network thread) whose messages land in a queue."""

    def __init__(self, port: int, client_id: str, *, clean: bool = True, level: int = 4,
                 user: str = "guest", password: str = "guest", expiry: int | None = None) -> None:
        version = MQTTProtocolVersion.MQTTv5 if level == 5 else MQTTProtocolVersion.MQTTv311
        self.level = level
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                                  clean_session=clean if level == 4 else None)
        self.client.username_pw_set(user, password)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connack: queue.Queue[tuple[bool, int]] = queue.Queue()
        self.subacks: queue.Queue[list[int]] = queue.Queue()
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subacks.put([int(r.value) for r in codes])
        self.client.on_message = lambda c, u, m: self.messages.put(m)
        self.client.on_connect = lambda c, u, flags, rc, props: self.connack.put(
            (bool(flags.session_present), int(rc.value)))
        self.port = port
        self.clean = clean
        self.expiry = expiry

    def connect(self, timeout: float = 30.0) -> tuple[bool, int]:
        """(session present, CONNACK code)."""
        kwargs: dict[str, Any] = {}
        if self.level == 5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.CONNECT)
            if self.expiry is not None:
                props.SessionExpiryInterval = self.expiry
            kwargs = {"clean_start": self.clean, "properties": props}
        self.client.connect("127.0.0.1", self.port, keepalive=30, **kwargs)
        self.client.loop_start()
        return self.connack.get(timeout=timeout)

    def subscribe(self, topic: str, qos: int = 1) -> list[int]:
        """The SUBACK's codes (waited for: a publish after it is routed to the session)."""
        info = self.client.subscribe(topic, qos)
        assert info[0] == mqtt.MQTT_ERR_SUCCESS, info
        return self.subacks.get(timeout=30)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos, retain)
        info.wait_for_publish(30)  # QoS 1: PUBACK, i.e. stored where it must be (MQ4)
        assert info.is_published(), f"no PUBACK for {payload!r}"

    def take(self, n: int, timeout: float = 30.0) -> list[mqtt.MQTTMessage]:
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{len(got)} of {n} messages within {timeout}s: "
                                     f"{[m.payload for m in got]}")
            try:
                got.append(self.messages.get(timeout=left))
            except queue.Empty:
                continue
        return got

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
