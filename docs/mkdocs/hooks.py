"""MkDocs hooks for the fastrebalance site.

* Some pages (Spark guide, reliability, benchmarks) are written alongside the code they
  describe and may not exist in every checkout; a nav entry for a missing page would
  fail the strict build. Those entries are dropped instead, so the nav keeps its order
  and the strict build still catches every other broken reference.
* ``<!-- fastrebalance-help: COMMAND -->`` in a page becomes that command's ``--help``
  output, taken from the parser itself, so the command-line reference cannot drift
  from the code. An unknown command is a warning, which fails the strict build.
* Code in a table cell (config keys, option names) may wrap at a space, or after a dot
  or an underscore, and nowhere else: a ``<wbr>`` follows each such dot or underscore,
  and the pieces between are ``<span class="nobr">`` (docs/assets/extra.css: no break
  inside, where a browser would otherwise break after a hyphen or a bracket). A column
  too narrow for ``parallel.rebalance.lag.threshold`` then shows ``parallel.rebalance.``
  over ``lag.threshold``, not ``parallel/.rebalan/ce``.
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


_TABLE = re.compile(r"<table\b.*?</table>", re.DOTALL)
_CODE = re.compile(r"(<code\b[^>]*>)(.*?)(</code>)", re.DOTALL)
#: A dot or an underscore between two characters of a word, outside any tag or entity
#: (neither contains one between word characters: ``&lt;``, ``<span class="n">``).
_JOINT = re.compile(r"(?<=\w)([._])(?=\w)")


def _piece(text: str) -> str:
    """A piece with no break opportunity of ours: kept whole if a browser would break it."""
    return f'<span class="nobr">{text}</span>' if re.search(r"[^\w.]", text) else text


def _breakable(code: str) -> str:
    """The code's text with ``<wbr>`` after each joint and its other pieces unbreakable.
    Code with tags inside (highlighting) only gets the ``<wbr>``, its tags untouched."""
    if "<" in code:
        parts = re.split(r"(<[^>]*>)", code)
        return "".join(p if p.startswith("<") else _JOINT.sub(r"\1<wbr>", p) for p in parts)
    out = []
    for chunk in re.split(r"(\s+)", code):
        if not chunk or chunk.isspace():
            out.append(chunk)
            continue
        pieces = _JOINT.sub("\\1\0", chunk).split("\0")
        out.append("<wbr>".join(_piece(p) for p in pieces))
    return "".join(out)


def on_page_content(html: str, **_: Any) -> str:
    if "<table" not in html:
        return html

    def table(m: re.Match[str]) -> str:
        return _CODE.sub(lambda c: c.group(1) + _breakable(c.group(2)) + c.group(3), m.group(0))

    return _TABLE.sub(table, html)
