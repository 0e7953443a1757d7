"""gateway/jetstream/_wire.c's module for the tests that compare its readings and writings
(the compiled twins) with their Python references, and why a twin cannot be compared.

Imported here, not through ``wire.compiled()``, so that test_wire_scan can check that the
gateway took the module that was built. ``compiled`` is None under CMQ_GATEWAY_PURE_PYTHON=1
(the gateway then reads in Python: the twins are skipped, the references still tested) and
where the package was installed without a C compiler.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest

PURE = os.environ.get("CMQ_GATEWAY_PURE_PYTHON", "") not in ("", "0")

compiled: Any = None
if not PURE:
    try:
        compiled = importlib.import_module("gateway.jetstream._wire")
    except ImportError:  # built without a C compiler: the Python references alone
        pass


def missing(*names: str) -> str | None:
    """Why the compiled twins ``names`` cannot be compared here, or None when they can."""
    if PURE:
        return "CMQ_GATEWAY_PURE_PYTHON=1: the gateway reads in Python, no compiled twin to compare"
    if compiled is None:
        return "gateway/jetstream/_wire.c not built (installed without a C compiler): no compiled twin to compare"
    absent = [n for n in names if not hasattr(compiled, n)]
    if absent:
        return f"this build of gateway/jetstream/_wire.c has no {', '.join(absent)} (stale: setup.py build_ext --inplace)"
    return None


def needs_compiled(*names: str) -> pytest.MarkDecorator:
    """Skips a test of the compiled ``names`` where they cannot be compared, saying why."""
    why = missing(*names)
    return pytest.mark.skipif(why is not None, reason=why or "")
