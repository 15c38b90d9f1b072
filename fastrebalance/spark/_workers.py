"""``register()``'s check that Spark's Python workers can run the source.

The source's code runs in Python processes that Spark starts with the interpreter of
``PYSPARK_PYTHON`` (or ``spark.pyspark.python``), not necessarily the one that called
``register()``. Without fastrebalance there, the first sign is ``No module named
'fastrebalance'`` deep in a worker's traceback at ``load()`` or at the first batch; with
another version there, driver and executors may disagree about the offset format.

The check runs one one-row Spark job whose Python function reports what the worker's Python
has. That is the only way to ask the Python Spark really runs: under Spark Connect the client
does not know the server's ``PYSPARK_PYTHON`` at all. The function is pickled by value (it is
local to ``_probe``), so it runs even where fastrebalance cannot be imported, and says so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["WorkerPython", "check_workers", "describe_problem", "parse_report"]

#: Spark's error when the worker interpreter cannot be started (java.io.IOException).
_CANNOT_RUN = re.compile(r'Cannot run program "([^"]+)"')
#: A worker that started but did not connect back in Spark's hard-coded 10 s: load, not setup.
_NO_CONNECT = "failed to connect back"


@dataclass(frozen=True)
class WorkerPython:
    """What the Python that Spark's workers run has, as its probe reported it."""

    executable: str
    version: str | None  #: fastrebalance's version there, None when it cannot be imported
    error: str | None  #: why fastrebalance (or pyarrow) cannot be imported there
    pyarrow: bool = True


def _make_probe() -> Any:
    # A local function: cloudpickle sends it by value, so that unpickling it in the worker
    # does not import this module (which would fail exactly where the check must speak).
    def probe(_: Any) -> str:
        import json
        import sys

        report: dict[str, Any] = {"executable": sys.executable}
        try:
            import fastrebalance

            report["version"] = fastrebalance.__version__
        except Exception as exc:  # ImportError, or a broken install
            report["error"] = f"{type(exc).__name__}: {exc}"
        try:
            import pyarrow  # noqa: F401
        except Exception:
            report["pyarrow"] = False
        return json.dumps(report)

    return probe


def parse_report(raw: str) -> WorkerPython:
    import json

    obj = json.loads(raw)
    return WorkerPython(
        executable=str(obj.get("executable") or "?"),
        version=obj.get("version"),
        error=obj.get("error"),
        pyarrow=bool(obj.get("pyarrow", True)),
    )


def _configured(spark: SparkSession, remote: bool) -> str:
    """Where the worker Python comes from, as far as this process can tell."""
    try:
        conf = spark.conf.get("spark.pyspark.python", None)
    except Exception:  # a Connect server may refuse to show a static conf
        conf = None
    if remote:
        return "the Spark Connect server's PYSPARK_PYTHON when it started" + (
            f", spark.pyspark.python={conf!r}" if conf else ""
        )
    env = os.environ.get("PYSPARK_PYTHON")
    return (
        f"PYSPARK_PYTHON={env!r}" if env else "PYSPARK_PYTHON not set (Spark's default: python3)"
    ) + (f", spark.pyspark.python={conf!r}" if conf else ", spark.pyspark.python not set")


def describe_problem(
    found: WorkerPython | None, expected_version: str, configured: str, failure: str = ""
) -> str | None:
    """The one message for a worker Python that cannot run the source, or None if it can.
    Pure, for the unit tests: ``found`` is None when the probe could not run at all."""
    fix = (
        f"Install fastrebalance[spark]=={expected_version} in the Python that Spark's workers"
        " run, or point PYSPARK_PYTHON (or spark.pyspark.python) at a Python that has it,"
        " before the SparkSession starts."
    )
    if found is None:
        program = _CANNOT_RUN.search(failure)
        what = (
            f"Spark cannot start the Python its workers run, {program.group(1)!r}"
            if program
            else f"Spark's Python worker failed before it could report anything ({failure})"
        )
        return f"fastrebalance.spark: {what}; it comes from {configured}. {fix}"
    where = f"Spark's Python workers run {found.executable} (from {configured})"
    if found.version is None:
        return (
            f"fastrebalance.spark: {where}, which cannot import fastrebalance ({found.error})."
            f" {fix}"
        )
    if found.version != expected_version:
        return (
            f"fastrebalance.spark: {where}, which has fastrebalance {found.version}, but this"
            f" process has {expected_version}: driver and workers must run the same version."
            f" {fix}"
        )
    if not found.pyarrow:
        return f"fastrebalance.spark: {where}, which cannot import pyarrow. {fix}"
    return None


def check_workers(spark: SparkSession) -> WorkerPython:
    """Run the probe in a Spark Python worker; raise RuntimeError with one clear message if
    that Python cannot run the source."""
    from pyspark.sql import functions as F

    import fastrebalance

    remote = type(spark).__module__.startswith("pyspark.sql.connect")
    probe = F.udf(_make_probe(), "string", useArrow=False)
    failure = ""
    found: WorkerPython | None = None
    for attempt in range(2):
        try:
            rows = spark.range(1, numPartitions=1).select(probe(F.col("id"))).collect()
            found = parse_report(rows[0][0])
            break
        except Exception as exc:
            failure = _first_line(str(exc))
            full = str(exc)
            if _NO_CONNECT in full and attempt == 0:
                continue  # a loaded machine, not a setup problem: ask once more
            program = _CANNOT_RUN.search(full)
            if program:
                failure = program.group(0)
            break
    problem = describe_problem(
        found, fastrebalance.__version__, _configured(spark, remote), failure
    )
    if problem is not None:
        raise RuntimeError(problem)
    assert found is not None
    return found


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return text[:300]
