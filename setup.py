"""The one thing pyproject.toml cannot say without an experimental table: the optional C modules
of the two frames of every message (gateway/protocol/fastpath.py says why) and of the audit
writer's rows (gateway/audit/fastformat.py), of the queue model's common path
(gateway/broker/queue.py), and of the runs of NATS messages a JetStream gateway
reads (gateway/jetstream/wire.py). Built when the machine has a compiler and
Python's headers; without them the package runs the same code in Python (``optional=True``: a
failed build is a warning, not an error)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gateway.protocol._frames", ["gateway/protocol/_frames.c"],
                             optional=True, extra_compile_args=["-O2"]),
                   Extension("gateway.broker._queue", ["gateway/broker/_queue.c"],
                             optional=True, extra_compile_args=["-O2"]),
                   Extension("gateway.audit._format", ["gateway/audit/_format.c"],
                             optional=True, extra_compile_args=["-O2"]),
                   Extension("gateway.jetstream._wire", ["gateway/jetstream/_wire.c"],
                             optional=True, extra_compile_args=["-O2"])])
