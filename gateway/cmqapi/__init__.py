"""CMQ's classic HTTP API on the gateway's store (SPEC CA1-CA4).

Applications written for Tencent Cloud CMQ's HTTP API (its SDKs, or the API pages) call
``/v2/index.php`` with ``Action=...`` and their SecretId's signature, and reach the same
queues and topics as AMQP (and MQTT) clients: a queue is the AMQP queue of the same name, a
topic the exchange of the same name, a subscription to a queue its binding (M2-M8).

* ``signing``: the signature, Timestamp and Nonce checks (pure);
* ``params``: CMQ's parameter forms (``name.n`` lists, ranges);
* ``errors``: CMQ's answer codes;
* ``core``: the request -> answer core (parameters in, the JSON dict out), with
  ``queues`` (CA2) and ``topics`` (CA3);
* ``app``: the aiohttp application and ``start_cmq_api`` (``--cmq-api-port``, default 15680).
"""

from gateway.cmqapi.app import make_app, start_cmq_api
from gateway.cmqapi.core import CmqApi

__all__ = ["CmqApi", "make_app", "start_cmq_api"]
