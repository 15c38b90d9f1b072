"""register() with a PYSPARK_PYTHON that cannot run the source fails at once, with one
message that names the interpreter and where it came from (issue 46, item 3).

Each case needs a SparkContext of its own (PYSPARK_PYTHON is read when it starts), so each
runs in a fresh Python process, from a folder outside the project (Spark's workers put the
driver's working folder on their path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytest.importorskip("pyspark", minversion="4.2")
pytest.importorskip("pyarrow")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

pytestmark = pytest.mark.integration

SCRIPT = """
from pyspark.sql import SparkSession
from fastrebalance.spark import register
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("OFF")
try:
    register(spark)
    print("REGISTERED")
except RuntimeError as exc:
    print("REFUSED " + str(exc))
finally:
    spark.stop()
"""


def _register_with(python: str, cwd: Path) -> str:
    env = {**os.environ, "PYSPARK_PYTHON": python}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith(("REFUSED", "REGISTERED"))]
    assert lines, done.stdout[-2000:] + done.stderr[-3000:]
    return lines[-1]


def test_register_names_an_interpreter_spark_cannot_start(tmp_path: Path) -> None:
    out = _register_with(str(tmp_path / "no-such" / "python"), tmp_path)
    assert out.startswith("REFUSED"), out
    assert "Spark cannot start the Python its workers run" in out
    assert f"PYSPARK_PYTHON='{tmp_path / 'no-such' / 'python'}'" in out
    assert "spark.pyspark.python" in out


def test_register_names_a_worker_python_without_fastrebalance(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # Spark's zip gives it pyspark; nothing else
    python = str(bare / "bin" / "python")
    out = _register_with(python, tmp_path)
    assert out.startswith("REFUSED"), out
    assert f"Spark's Python workers run {python}" in out
    assert "cannot import fastrebalance (ModuleNotFoundError: No module named" in out
    assert f"PYSPARK_PYTHON='{python}'" in out
