"""The Celery app the Celery test runs in a worker subprocess (broker URL from the environment)."""

from __future__ import annotations

import os

from celery import Celery

QUEUE = os.environ.get("CMQ_TEST_CELERY_QUEUE", "celery")
app = Celery("cmq_gateway_tests", broker=os.environ.get("CMQ_TEST_BROKER_URL", "pyamqp://"),
             backend="rpc://")
app.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False, result_expires=60)


@app.task(name="cmq_gateway_tests.add")
def add(a: int, b: int) -> int:
    return a + b
