"""The OpenAPI 3 description of the CMQ part of the management API (``/api/cmq/...``).

Kept as Python data next to the handlers so a test can check that every CMQ route the
application serves is described here, and nothing else.
"""

from __future__ import annotations

from typing import Any

__all__ = ["openapi_document"]

_VHOST = {"name": "vhost", "in": "path", "required": True, "description": "Virtual host (M1), URL-encoded: %2F is /",
          "schema": {"type": "string"}}
_EXCHANGE = {"name": "exchange", "in": "path", "required": True,
             "description": "AMQP exchange name, URL-encoded; its CMQ topic is shown as topicName (L2)",
             "schema": {"type": "string"}}
_QUEUE = {"name": "queue", "in": "path", "required": True, "description": "AMQP queue name, URL-encoded",
          "schema": {"type": "string"}}
_SUB = {"name": "name", "in": "path", "required": True, "description": "Subscription name",
        "schema": {"type": "string"}}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {"400": _json(_ref("Error"), "A CMQ limit or rule refused it (names the rule)"),
           "401": {"description": "Missing or wrong login, not a management user, a vhost the user may "
                                  "not use, or a configure/write/read permission refused (SE1)"},
           "404": _json(_ref("Error"), "No such vhost, exchange, queue or subscription")}


def _op(summary: str, responses: dict[str, Any], params: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "parameters": params or [], "responses": {**responses, **_ERRORS}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def openapi_document() -> dict[str, Any]:
    num = {"type": "number"}
    integer = {"type": "integer"}
    string = {"type": "string"}
    strings = {"type": "array", "items": string}
    schemas: dict[str, Any] = {
        "Error": {"type": "object", "properties": {"error": string, "reason": string, "rule": string}},
        "Head": {"type": "object", "nullable": True, "description": "D4: the subscription's oldest unresolved "
                 "message", "properties": {"msgId": string, "status": string, "attempts": integer,
                                            "nextRetryTime": {"type": "number", "nullable": True},
                                            "inFlight": {"type": "boolean"}}},
        "Subscription": {"type": "object", "properties": {
            "subscriptionName": string, "protocol": {"type": "string", "enum": ["queue", "http", "exchange"]},
            "endpoint": string, "notifyStrategy": {"type": "string", "enum": ["BACKOFF_RETRY",
                                                                              "EXPONENTIAL_DECAY_RETRY"]},
            "notifyContentFormat": {"type": "string", "enum": ["JSON", "SIMPLIFIED"]},
            "msgCount": {"type": "integer", "description": "D9: messages waiting for or in retry"},
            "blockedBy": {"type": "string", "nullable": True}, "head": _ref("Head"),
            "lastError": {"type": "object", "nullable": True, "description": "HTTP subscriptions only: the last "
                          "failed push", "properties": {"time": num, "msgId": string, "error": string}},
            "filterTag": strings, "bindingKey": strings}},
        "NewSubscription": {"type": "object", "required": ["subscriptionName", "endpoint"], "properties": {
            "subscriptionName": string, "protocol": {"type": "string", "enum": ["http", "https"]},
            "endpoint": {"type": "string", "description": "http:// or https:// URL (D7)"},
            "notifyStrategy": {"type": "string", "enum": ["BACKOFF_RETRY", "EXPONENTIAL_DECAY_RETRY"]},
            "notifyContentFormat": {"type": "string", "enum": ["JSON", "SIMPLIFIED"]},
            "filterTag": strings, "bindingKey": strings, "topicOwner": string}},
        "Topic": {"type": "object", "properties": {
            "vhost": string, "exchange": string, "exchangeType": string, "topicName": string,
            "filterType": {"type": "string", "enum": ["tag", "routing_key"]},
            "maxMsgSize": {"type": "integer", "description": "L6: 1024-1048576 bytes"},
            "msgRetentionSeconds": integer, "msgCount": {"type": "integer", "description": "D9: retained"},
            "subscriptionCount": integer,
            "subscriptions": {"type": "array", "items": _ref("Subscription")}}},
        "TopicAttributes": {"type": "object", "required": ["maxMsgSize"],
                            "properties": {"maxMsgSize": integer}},
        "Queue": {"type": "object", "properties": {
            "vhost": string, "queue": string, "queueName": string, "activeMsgNum": integer,
            "inactiveMsgNum": integer, "delayMsgNum": integer, "rewindMsgNum": integer,
            "attributes": {"type": "object", "properties": {
                "visibilityTimeout": num, "msgRetentionSeconds": num, "maxMsgSize": integer,
                "maxMsgHeapNum": integer, "rewindSeconds": num, "pollingWaitSeconds": num,
                "delaySeconds": num, "deadLetterPolicy": {"type": "object", "nullable": True}}},
            "arguments": {"type": "object"}}},
        "LimitReport": {"type": "object", "description": "PF4: the migration report of one vhost: per CMQ "
                        "rule, what broke it in the compatible profile", "properties": {
                            "vhost": string, "profile": {"type": "string", "enum": ["compatible", "cmq"]},
                            "rules": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                                "rule": string, "count": integer, "objects": strings, "users": strings,
                                "not_stored": integer, "entries": {"type": "array", "items": {
                                    "type": "object", "properties": {
                                        "vhost": string, "rule": string, "object": string, "user": string,
                                        "peer": string, "count": integer, "first_seen": num, "last_seen": num,
                                        "worst_value": integer, "limit": integer, "example": string}}}}}}}},
        "Profile": {"type": "object", "properties": {
            "vhost": string, "profile": {"type": "string", "enum": ["compatible", "cmq"]},
            "gateway_profile": string, "override": {"type": "boolean"}}},
        "NewProfile": {"type": "object", "required": ["profile"], "properties": {
            "profile": {"type": "string", "enum": ["compatible", "cmq"], "nullable": True,
                        "description": "null drops the vhost's override (PF1)"}}},
        "Rewind": {"type": "object", "required": ["rewindTo"],
                   "properties": {"rewindTo": {"type": "number", "description": "Unix seconds (Q6)"}}},
    }
    paths: dict[str, Any] = {
        "/api/cmq/openapi.json": {"get": _op("This document", {"200": _json({"type": "object"})})},
        "/api/cmq/topics": {"get": _op("Every topic (exchange) with its retained count (D9)",
                                       {"200": _json({"type": "array", "items": _ref("Topic")})})},
        "/api/cmq/topics/{vhost}": {"get": _op("The topics of one vhost",
                                               {"200": _json({"type": "array", "items": _ref("Topic")})},
                                               [_VHOST])},
        "/api/cmq/topics/{vhost}/{exchange}": {"get": _op("One topic with its subscriptions",
                                                          {"200": _json(_ref("Topic"))}, [_VHOST, _EXCHANGE])},
        "/api/cmq/topics/{vhost}/{exchange}/attributes": {"put": _op(
            "Change the topic's maximum message size (L6)", {"200": _json(_ref("Topic"))},
            [_VHOST, _EXCHANGE], _ref("TopicAttributes"))},
        "/api/cmq/topics/{vhost}/{exchange}/subscriptions": {
            "get": _op("The topic's subscriptions with waiting counts and head state (D4, D9)",
                       {"200": _json({"type": "array", "items": _ref("Subscription")})}, [_VHOST, _EXCHANGE]),
            "post": _op("Create an HTTP(S) subscription (D7)", {
                "201": _json(_ref("Subscription"), "Created"),
                "403": _json(_ref("Error"), "SE3: the endpoint matches no push.allow pattern, or its host is at a "
                                            "loopback, link-local, private or unspecified address")},
                        [_VHOST, _EXCHANGE], _ref("NewSubscription"))},
        "/api/cmq/topics/{vhost}/{exchange}/subscriptions/{name}": {"delete": _op(
            "Remove an HTTP(S) subscription", {"204": {"description": "Removed"}}, [_VHOST, _EXCHANGE, _SUB])},
        "/api/cmq/queues": {"get": _op("Every queue with its CMQ counts and attributes",
                                       {"200": _json({"type": "array", "items": _ref("Queue")})})},
        "/api/cmq/queues/{vhost}": {"get": _op("The queues of one vhost",
                                               {"200": _json({"type": "array", "items": _ref("Queue")})},
                                               [_VHOST])},
        "/api/cmq/queues/{vhost}/{queue}": {"get": _op("One queue: active, inactive, delayed, rewindable "
                                                       "(Q1, Q4, Q6)", {"200": _json(_ref("Queue"))},
                                                       [_VHOST, _QUEUE])},
        "/api/cmq/queues/{vhost}/{queue}/rewind": {"post": _op(
            "Rewind the queue to a time (Q6)", {"200": _json(_ref("Queue"))}, [_VHOST, _QUEUE], _ref("Rewind"))},
        "/api/cmq/queues/{vhost}/{queue}/messages": {"delete": _op(
            "Purge the queue's Active and delayed messages",
            {"200": _json({"type": "object", "properties": {"purged": integer}})}, [_VHOST, _QUEUE])},
        "/api/cmq/limits": {"get": _op("The migration report of every vhost (PF4)", {"200": _json({
            "type": "object", "properties": {"profile": string,
                                             "vhosts": {"type": "array", "items": _ref("LimitReport")}}})})},
        "/api/cmq/limits/{vhost}": {
            "get": _op("The migration report of one vhost (PF4)", {"200": _json(_ref("LimitReport"))}, [_VHOST]),
            "delete": _op("Start the vhost's report over (administrator)", {"204": {"description": "Cleared"}},
                          [_VHOST])},
        "/api/cmq/vhosts/{vhost}/profile": {
            "get": _op("The vhost's profile (PF1)", {"200": _json(_ref("Profile"))}, [_VHOST]),
            "put": _op("Change the vhost's profile from now on (administrator; PF1)",
                       {"200": _json(_ref("Profile"))}, [_VHOST], _ref("NewProfile"))},
        # UI3: gateway/management/trace.py (the web console's message trace)
        "/api/cmq/trace/{vhost}/{msg_id}": {"get": _op(
            "A message's records in the audit log, oldest first, from the folders of the last ?hours= (default "
            "24, at most 168); monitoring tag; 404 when the audit log is off",
            {"200": _json({"type": "object", "properties": {
                "vhost": string, "msg_id": string, "hours": num, "files": integer, "truncated": {"type": "boolean"},
                "events": {"type": "array", "items": {"type": "object", "description": "audit records (A2)"}}}})},
            [_VHOST, {"name": "msg_id", "in": "path", "required": True, "description": "The CMQ message ID (M11)",
                      "schema": string}])},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "cmq-gateway CMQ management API", "version": "1",
                 "description": "CMQ topics, subscriptions and queues behind the AMQP gateway. HTTP basic "
                                "auth with the gateway's users (management tags, as RabbitMQ)."},
        "components": {"schemas": schemas,
                       "securitySchemes": {"basic": {"type": "http", "scheme": "basic"}}},
        "security": [{"basic": []}],
        "paths": paths,
    }
