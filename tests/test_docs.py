"""The documentation site builds with warnings as errors, and the reference pages stay
complete: every configuration key, every command, every page reachable from the nav.

The build runs ``mkdocs build --strict`` (broken links, anchors, missing pages and
docstring problems are warnings, hence failures) into a temporary directory. It is
skipped only when the docs tools are not installed; ``make test`` installs them.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastrebalance._config import CONFIG_KEYS
from fastrebalance.tools.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONFIG = DOCS / "mkdocs" / "mkdocs.yml"
BUILD_BUDGET_S = 30.0

_TOOLS = ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "pymdownx")


def _missing_tools() -> list[str]:
    missing = []
    for name in _TOOLS:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.mark.skipif(
    bool(_missing_tools()), reason="docs tools not installed: pip install -e '.[docs]'"
)
def test_site_builds_strict_and_fast(tmp_path: Path) -> None:
    site = tmp_path / "site"
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(CONFIG), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # paths in the config must not depend on where the build starts
    )
    took = time.monotonic() - began
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < BUILD_BUDGET_S, f"docs build took {took:.1f} s"
    for page in ("index", "quickstart", "configuration", "design", "operations", "cli"):
        assert (site / f"{page}.html").is_file(), page
    for page in ("faq", "api"):
        assert (site / f"{page}.html").is_file(), page
    api = (site / "api.html").read_text()
    assert "child_consumer_is_alive" in api and "catchup_status" in api, "API not generated"
    cli = (site / "cli.html").read_text()
    assert "usage: fastrebalance status" in cli, "--help not rendered into the CLI page"
    quickstart = (site / "quickstart.html").read_text()
    assert "enable.parallel.rebalance" in quickstart and "EmbeddedKafka" in quickstart
    # a key in a table may wrap after its dots only (tests/test_docs_browser.py: where it did)
    configuration = (site / "configuration.html").read_text()
    assert "<code>enable.<wbr>parallel.<wbr>rebalance</code>" in configuration


def _nav_pages() -> set[str]:
    return set(re.findall(r"^\s*-\s+[^:]+:\s+(\S+\.md)\s*$", CONFIG.read_text(), re.MULTILINE))


def test_every_page_is_in_the_nav() -> None:
    pages = {p.name for p in DOCS.glob("*.md")}
    pages |= {f"notes/{p.name}" for p in (DOCS / "notes").glob("*.md")}
    orphans = pages - _nav_pages()
    assert not orphans, f"add {sorted(orphans)} to the nav in {CONFIG.relative_to(ROOT)}"


def test_every_configuration_key_is_documented_with_its_default() -> None:
    text = (DOCS / "configuration.md").read_text()
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \| `([^`]+)` \|", text, re.M)
    }
    for key, (default, _accepted) in CONFIG_KEYS.items():
        assert key in rows, f"{key} missing from docs/configuration.md"
        assert rows[key] == default, f"{key}: documented default {rows[key]!r}, code {default!r}"


def test_every_command_has_its_help_in_the_cli_page() -> None:
    text = (DOCS / "cli.md").read_text()
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    for name in action.choices:  # type: ignore[union-attr]
        assert f"<!-- fastrebalance-help: {name} -->" in text, f"document {name} in docs/cli.md"


def test_every_metric_is_in_the_metrics_page() -> None:
    from fastrebalance.metrics import METRICS, STATUS_METRICS

    page = (DOCS / "metrics.md").read_text()
    missing = [m.name for m in (*METRICS, *STATUS_METRICS) if f"`{m.name}`" not in page]
    assert not missing, missing


def test_the_pages_show_the_examples_as_they_are() -> None:
    # an include line (`--8<--`) is read as plain text on GitHub, where the README's links
    # lead: the examples are copied into the page, and the copy must not drift
    pages = "".join((DOCS / p).read_text() for p in ("quickstart.md", "operations.md"))
    copies = re.findall(r"<!-- example: (\S+) .*?-->\n```python\n(.*?)\n```", pages, re.S)
    assert [f for f, _ in copies] == [
        "examples/basic_consumer.py", "examples/asyncio_consumer.py", "examples/monitoring.py"
    ]  # fmt: skip
    for path, code in copies:
        assert code == (ROOT / path).read_text().rstrip("\n"), f"{path}: the copy drifted"
    assert "--8<--" not in "".join(p.read_text() for p in DOCS.glob("*.md"))
