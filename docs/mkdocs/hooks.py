"""MkDocs hooks for the fastrebalance site.

* Some pages (Spark guide, reliability, benchmarks) are written alongside the code they
  describe and may not exist in every checkout; a nav entry for a missing page would
  fail the strict build. Those entries are dropped instead, so the nav keeps its order
  and the strict build still catches every other broken reference.
* ``<!-- fastrebalance-help: COMMAND -->`` in a page becomes that command's ``--help``
  output, taken from the parser itself, so the command-line reference cannot drift
  from the code. An unknown command is a warning, which fails the strict build.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.fastrebalance")

#: Pages that may be absent; any other missing page stays an error.
OPTIONAL_PAGES = frozenset({"spark.md", "reliability.md", "benchmarks.md"})

_HELP = re.compile(r"^<!-- fastrebalance-help: *([\w-]*) *-->$", re.MULTILINE)
#: Help is wrapped at a fixed width, whatever terminal builds the site.
_HELP_COLUMNS = "88"


def _prune(items: list[Any], docs_dir: Path) -> list[Any]:
    kept = []
    for item in items:
        if isinstance(item, dict):
            (title, target), *_ = item.items()
            if isinstance(target, list):
                target = _prune(target, docs_dir)
                if not target:
                    continue
                kept.append({title: target})
                continue
            if target in OPTIONAL_PAGES and not (docs_dir / target).is_file():
                log.info("nav: %s not written yet, left out", target)
                continue
        kept.append(item)
    return kept


def on_config(config: Any) -> Any:
    if config.nav:
        config.nav = _prune(config.nav, Path(config.docs_dir))
    return config


@contextlib.contextmanager
def _columns(value: str) -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def _help(command: str, page: str) -> str:
    from fastrebalance.tools.cli import build_parser

    with _columns(_HELP_COLUMNS):
        parser = build_parser()
        if not command:
            text = parser.format_help()
        else:
            sub = next(a for a in parser._actions if a.dest == "command")
            choice = sub.choices.get(command)  # type: ignore[union-attr]
            if choice is None:
                log.warning("%s: no command %r for its fastrebalance-help marker", page, command)
                return ""
            text = choice.format_help()
    shown = f"fastrebalance {command} --help".replace("  ", " ")
    return f"```text\n$ {shown}\n{text.rstrip()}\n```"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if "fastrebalance-help:" not in markdown:
        return markdown
    return _HELP.sub(lambda m: _help(m.group(1), page.file.src_uri), markdown)
