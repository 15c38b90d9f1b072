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

__all__ = ["worker_python"]

_made: dict[str, str] = {}


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
