"""The documentation site in a real browser (headless Chromium): no table wider than the
page column, and code in a table cell (config keys, option names) wrapped after a dot or an
underscore only. The readthedocs theme keeps table cells on one line: at 1280 px, 61 of the
site's 63 tables overflowed (up to 5,949 px), and the configuration reference's "meaning"
column was off-screen; letting cells break anywhere then split keys mid-word
("enable./parallel/.rebalan/ce"). No static check sees that; a browser's layout does.

Chromium is Debian's (``.ci/run`` installs it); without it the test skips, saying so.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "docs" / "mkdocs" / "mkdocs.yml"
WIDTH = 1280
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

#: Measures, once the page has loaded (the theme's script has wrapped its tables), every
#: table of the page column against the column's width, and writes the result into the
#: DOM that --dump-dom prints.
_PROBE = """<script>
window.addEventListener('load', () => {
  const column = document.querySelector('.rst-content');
  const room = column.clientWidth;
  const tables = [...column.querySelectorAll('table')];
  const wide = tables.map(t => t.scrollWidth).filter(w => w > room + 1);
  // Each place a table's code wrapped: the characters on both sides of the line break,
  // found as two neighbouring characters whose boxes stand on different lines.
  const breaks = [];
  let wrapped = 0;
  for (const code of column.querySelectorAll('table code')) {
    if (code.getClientRects().length < 2) continue;
    wrapped += 1;
    const chars = [];
    const walk = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      for (let i = 0; i < node.length; i++) chars.push([node, i]);
    }
    const range = document.createRange();
    let top = null, prev = '', space = false;  // space: a blank since prev, a break is fine
    for (const [node, i] of chars) {
      const ch = node.data[i];
      if (!ch.trim()) { space = true; continue; }
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const box = range.getBoundingClientRect();
      if (box.width === 0 && box.height === 0) continue;
      if (top !== null && box.top > top + 2 && !space) {
        breaks.push([code.textContent, prev + '|' + ch]);
      }
      top = box.top;
      prev = ch;
      space = false;
    }
  }
  document.body.setAttribute('data-probe', JSON.stringify(
    {room, tables: tables.length, wide, wrapped, breaks}));
});
</script>"""


def _measure(page: Path) -> dict[str, object]:
    probed = page.with_name(f"probe-{page.name}")
    html = page.read_text()
    probed.write_text(html.replace("</body>", _PROBE + "</body>"))
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={page.parent / ('profile-' + page.stem)}",
         f"--window-size={WIDTH},900", "--virtual-time-budget=5000", "--dump-dom",
         probed.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    found = re.search(r"data-probe=\"([^\"]*)\"", proc.stdout)
    assert found, f"{page.name}: no measurement ({proc.returncode}): {proc.stderr[-500:]}"
    return json.loads(found.group(1).replace("&quot;", '"'))


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (apt-get install chromium)")
def test_no_table_is_wider_than_the_page_column(tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(CONFIG), "-d", str(site)],
        check=True, capture_output=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    pages = sorted(p for p in site.glob("*.html") if p.stem not in ("404", "search"))
    with ThreadPoolExecutor(2) as pool:
        measured = dict(zip([p.stem for p in pages], pool.map(_measure, pages), strict=True))
    tables = sum(int(m["tables"]) for m in measured.values())  # type: ignore[call-overload]
    assert tables > 50, measured  # the probe saw the site's tables
    wide = {page: m["wide"] for page, m in measured.items() if m["wide"]}
    assert not wide, f"tables wider than the page column ({WIDTH} px window): {wide}"
    # code that wrapped did so after a dot or an underscore (or at a space)
    assert sum(int(m["wrapped"]) for m in measured.values()) > 0, measured  # type: ignore[call-overload]
    mid_word = {
        page: [(text, at) for text, at in m["breaks"] if at[0] not in "._"]  # type: ignore[attr-defined]
        for page, m in measured.items()
    }
    mid_word = {page: found for page, found in mid_word.items() if found}
    assert not mid_word, f"code in tables broken inside a word ({WIDTH} px window): {mid_word}"
