#!/usr/bin/env python3
"""Post-crash latency, catch-up speed and overhead: fastrebalance vs plain confluent-kafka.

The same benchmark as ``fastrebalance bench`` (the options, the output and the exit
codes are that command's); kept here so the benchmark is found where benchmarks live
and runs from a checkout without installing the package. ``--help`` lists the options;
docs/benchmarks.md has the numbers and how to read them.

    python benchmarks/run.py --backlogs 10000,100000 --reps 1
"""

from __future__ import annotations

import sys
from pathlib import Path

# A checkout that is not installed still runs its own code.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastrebalance.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
