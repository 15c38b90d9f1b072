"""Where the Spark drivers of the benchmarks and harnesses listen: loopback only.

Spark's driver opens two ports for its executors (RPC, block manager) on the host's network
address when its name resolves to loopback (on this machine, 192.0.2.2 on eth0), reachable
from other hosts. ``local_driver_conf`` keeps a local master's driver on 127.0.0.1; the
listening sockets are read from ``/proc``, as the kernel sees them.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fastrebalance.testing._sparkpython import local_driver_conf

pytestmark = pytest.mark.integration

#: Runs in its own process: a local session made as spark_bench and the chaos harness make
#: it, one job, then the listening addresses of its JVM (a child of this process).
_PROBE = """
import json, os, sys
from pathlib import Path
from pyspark.sql import SparkSession
from fastrebalance.testing._sparkpython import local_driver_conf
sys.path.insert(0, sys.argv[1])
from test_spark_listeners import listening
conf = local_driver_conf("local[1]") if sys.argv[2] == "loopback" else {}
spark = (SparkSession.builder.master("local[1]").appName("listeners")
         .config("spark.ui.enabled", "false").config(map=conf).getOrCreate())
spark.range(3).count()
me = os.getpid()
kids = []
for d in Path("/proc").iterdir():
    try:
        if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
            kids.append(int(d.name))
    except OSError:
        pass
print(json.dumps(listening(kids)))
spark.stop()
"""


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ipaddress.IPv4Address(words)
    v6 = ipaddress.IPv6Address(words)
    return v6.ipv4_mapped or v6


def listening(pids: list[int]) -> list[str]:
    """The local addresses of the TCP sockets these processes listen on."""
    inodes = set()
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir():
            try:
                target = fd.readlink().as_posix()
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                host, port = fields[1].split(":")
                found.append(f"{_address(host)}:{int(port, 16)}")
    return found


def test_local_driver_conf_is_loopback_for_a_local_master_only() -> None:
    assert local_driver_conf("local[2]") == {
        "spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1",
    }  # fmt: skip
    assert local_driver_conf("spark://10.0.0.5:7077") == {}


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc")
def test_a_local_spark_driver_listens_on_loopback_only() -> None:
    pytest.importorskip("pyspark")
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, str(Path(__file__).parent), "loopback"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    addresses = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(addresses) >= 2, addresses  # the driver's RPC and block manager ports
    hosts = {ipaddress.ip_address(a.rsplit(":", 1)[0]) for a in addresses}
    assert all(h.is_loopback for h in hosts), addresses
