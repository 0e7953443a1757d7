"""The mapping from AMQP 0-9-1 onto the CMQ model (SPEC M1-M16).

``Broker`` holds the vhosts, the store, the scheduler and the group-commit flusher; the
transport makes one ``Session`` per AMQP connection and feeds it channel events.
"""

from gateway.broker.broker import Broker, BrokerConfig
from gateway.broker.session import Session

__all__ = ["Broker", "BrokerConfig", "Session"]
