"""The end-to-end tests reuse the one session-scoped SparkSession of ``tests/spark/conftest.py``.

pytest imports every ``conftest.py`` under the plain module name ``conftest`` (the test folders
are not packages), so that file cannot be imported by name: it is loaded here from its path
under a name of its own, and its ``spark`` fixture is re-exported unchanged.  The fixture calls
``SparkSession.builder.getOrCreate()``, so when both folders run in one pytest session the
second use gets the very same local session (one JVM, one SparkSession).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SPARK_CONFTEST = Path(__file__).resolve().parent.parent / "spark" / "conftest.py"
_NAME = "tests_spark_conftest_shared"


def _load_spark_conftest():  # type: ignore[no-untyped-def]
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, _SPARK_CONFTEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


spark = _load_spark_conftest().spark

__all__ = ["spark"]
