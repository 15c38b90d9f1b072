"""The Python that Spark starts for its workers, in the suite and the Spark harnesses.

Spark puts ``pyspark.zip`` first on every Python worker's ``PYTHONPATH``, and Python cannot
cache bytecode inside a zip: each worker, and the driver-side processes that run a Python
data source (``plan_data_source_read``, the streaming source runner), compiles pyspark
again. On this 2-core machine at load average 25, importing the modules a data-source
worker needs took 2.9-3.4 s from the zip against 0.6-1.4 s from site-packages, and Spark
gives such a process a hard-coded 10 s to connect back (``PythonWorkerFactory``) before it
fails the query with "Python worker failed to connect back" (seen in ``make test`` under
load). The same pyspark, imported from site-packages where its bytecode is cached, keeps
that wait short.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["local_driver_conf", "worker_python"]

_made: dict[str, str] = {}

#: Where a local master's driver listens. Spark's driver opens two ports for its executors
#: (RPC and block manager) on the address the host name resolves to, or on the first
#: non-loopback interface when that is loopback ("using 192.0.2.2 instead (on interface
#: eth0)" on this machine): reachable from other hosts, with no authentication by default.
#: A local master's executors are threads of the driver's JVM, so loopback serves them, and
#: the harnesses and benchmarks publish nothing (docs/operations.md, "Listeners").
_LOOPBACK_DRIVER = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}


def local_driver_conf(master: str) -> dict[str, Any]:
    """The Spark settings that keep a driver of ``master`` on loopback: none for a cluster
    master, whose executors on other hosts must reach the driver."""
    return dict(_LOOPBACK_DRIVER) if master.startswith("local") else {}


def worker_python() -> str:
    """A ``PYSPARK_PYTHON``: this interpreter (it has fastrebalance installed), with
    site-packages' pyspark ahead of Spark's zip. Made once per process."""
    import pyspark

    site = str(Path(pyspark.__file__).resolve().parent.parent)
    if site in _made and os.path.exists(_made[site]):
        return _made[site]
    folder = Path(tempfile.mkdtemp(prefix="fastrebalance-python-"))
    wrapper = folder / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    _made[site] = str(wrapper)
    return str(wrapper)
