"""register()'s worker check: the message for each way the workers' Python can be wrong."""

from __future__ import annotations

import json

from fastrebalance.spark._workers import WorkerPython, describe_problem, parse_report

CONF = "PYSPARK_PYTHON='/venv/bin/python', spark.pyspark.python not set"


def test_a_worker_python_without_fastrebalance_is_named_with_its_source() -> None:
    found = WorkerPython("/usr/bin/python3", None, "ModuleNotFoundError: No module named 'x'")
    msg = describe_problem(found, "1.0", CONF)
    assert msg is not None
    assert "/usr/bin/python3" in msg and "No module named 'x'" in msg
    assert "PYSPARK_PYTHON='/venv/bin/python'" in msg and "spark.pyspark.python" in msg


def test_another_version_in_the_workers_is_refused() -> None:
    msg = describe_problem(WorkerPython("/w/python", "0.9", None), "1.0", CONF)
    assert msg is not None and "0.9" in msg and "1.0" in msg and "/w/python" in msg


def test_a_worker_python_without_pyarrow_is_refused() -> None:
    msg = describe_problem(WorkerPython("/w/python", "1.0", None, pyarrow=False), "1.0", CONF)
    assert msg is not None and "pyarrow" in msg


def test_an_interpreter_spark_cannot_start_is_named() -> None:
    failure = 'Cannot run program "/nope/python": error=2, No such file or directory'
    msg = describe_problem(None, "1.0", CONF, failure)
    assert msg is not None and "'/nope/python'" in msg and "PYSPARK_PYTHON" in msg


def test_the_right_python_passes() -> None:
    assert describe_problem(WorkerPython("/w/python", "1.0", None), "1.0", CONF) is None


def test_the_probe_report_parses() -> None:
    raw = json.dumps({"executable": "/w/python", "error": "boom", "pyarrow": False})
    assert parse_report(raw) == WorkerPython("/w/python", None, "boom", pyarrow=False)


def test_register_refuses_pyspark_4_1_naming_the_missing_api(monkeypatch) -> None:
    """Issue 46, item 4: 4.0 and 4.1 have Python streaming sources, without the start offset
    and read limit in latestOffset: refused by name, before anything runs."""
    import pytest

    pyspark = pytest.importorskip("pyspark")
    from fastrebalance.spark import register

    for old in ("4.1.3", "4.0.4"):
        monkeypatch.setattr(pyspark, "__version__", old)
        with pytest.raises(RuntimeError) as info:
            register(object())  # type: ignore[arg-type]
        msg = str(info.value)
        assert f"found {old}" in msg and ">= 4.2" in msg
        assert "latestOffset(start, limit)" in msg and "SupportsAdmissionControl" in msg
