"""``fastrebalance spark-offsets``: where a stopped Kafka query stands, as ``startingOffsets``.

Moving a query between Spark's ``format("kafka")`` and this source, either way, is a new
query on a new checkpoint that starts where the old one stopped. The command reads the old
checkpoint (``fastrebalance.spark._checkpoint``) and prints the ``startingOffsets`` JSON for
the new query. No Spark and no Kafka needed: it reads two folders of small files.
"""

from __future__ import annotations

import argparse
import sys

from . import _args as a


def add_command(commands: a.Commands) -> None:
    p = a.command(
        commands,
        "spark-offsets",
        "print a stopped Spark Kafka query's position as startingOffsets JSON",
        (
            "Reads CHECKPOINT (a Structured Streaming checkpoint folder of a query on Spark's "
            'format("kafka") or on format("fastrebalance"), local or mounted) and prints, '
            "as the startingOffsets JSON of a new query, the first offset per partition that "
            "its last committed batch did not read. A batch logged but not committed counts "
            "as unread, as Spark replays it. For a fastrebalance checkpoint with backlog "
            "still pending, that is the lowest pending offset: the records it had read above "
            "it are read again, and the command says how many (stderr).",
            'To move a format("kafka") query to this source, the source\'s '
            "startingOffsetsFromCheckpoint option does the same without the copy.",
        ),
        """\
examples:
  fastrebalance spark-offsets /chk/orders
  fastrebalance spark-offsets /chk/orders > starting.json
""",
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="the old query's checkpoint folder")
    p.set_defaults(func=_spark_offsets)


def _spark_offsets(args: argparse.Namespace) -> int:
    from ..spark._checkpoint import read_checkpoint

    try:
        found = read_checkpoint(args.checkpoint)
    except (ValueError, OSError) as exc:
        print(f"spark-offsets: {exc}", file=sys.stderr)
        return a.EXIT_ERROR
    print(found.starting_offsets())
    note = f"{found.kind} checkpoint, batch {found.batch} (the last committed)"
    if found.reread:
        note += (
            f"; backlog was still pending: starting there reads {found.reread} records again"
            " (let the catch-up finish, query.lastProgress shows no list in endOffset, to"
            " avoid it)"
        )
    print(note, file=sys.stderr)
    return a.EXIT_OK
