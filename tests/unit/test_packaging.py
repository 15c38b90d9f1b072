"""What a user installs is what was tested: the sdist and the wheel built from a copy of this
checkout carry the licence, the notice and the sources they promise, and the wheel installed
alone into a fresh virtualenv runs.

Nothing is downloaded, so that the check fits the CI budget (about 15 s) and runs offline:
the build runs without isolation (``build`` and setuptools come from the ``test`` extra), the
wheel is installed with ``--no-deps``, and the fresh venv reaches the dependencies through a
``.pth`` file naming this interpreter's site-packages. That file only *appends* a directory
(its own ``.pth`` files, the editable install's among them, are not read), so the package
itself can only come from the wheel, which the test checks. The build runs on a copy in a
temporary directory: the checkout gets no ``build/`` or ``*.egg-info`` from it, and two
workers never share a path.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import fastrebalance

ROOT = Path(__file__).resolve().parents[2]
VERSION = fastrebalance.__version__
#: What the sdist must carry besides the package: the docs, examples and tests (and what the
#: tests read) in full.
SDIST_TREES = ("docs", "examples", "tests")
SDIST_FILES = ("LICENSE", "NOTICE", "CHANGELOG.md", "README.md", "pyproject.toml")
#: Not sources: left out of the copy that is built.
_NOT_SOURCES = {
    ".venv", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
    "__pycache__", "build", "dist", ".site",
}  # fmt: skip

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("build") is None,
    reason="the 'build' package is not installed (make test installs the test extra)",
)


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in _NOT_SOURCES or n.endswith((".egg-info", ".pyc"))}


def _clean_env() -> dict[str, str]:
    """The environment without anything that would put other code on sys.path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sdist, and the wheel built from it (``python -m build``'s own order: a file the
    sdist lacks is missing from the wheel too)."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_ignore)
    out = tmp / "dist"
    run = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return Built(
        sdist=out / f"fastrebalance-{VERSION}.tar.gz",
        wheel=out / f"fastrebalance-{VERSION}-py3-none-any.whl",
    )


def test_the_wheel_carries_licence_notice_and_metadata(built: Built) -> None:
    info = f"fastrebalance-{VERSION}.dist-info"
    with zipfile.ZipFile(built.wheel) as whl:
        names = set(whl.namelist())
        assert f"{info}/licenses/LICENSE" in names, sorted(n for n in names if info in n)
        assert f"{info}/licenses/NOTICE" in names
        licence = whl.read(f"{info}/licenses/LICENSE").decode()
        notice = whl.read(f"{info}/licenses/NOTICE").decode()
        metadata = whl.read(f"{info}/METADATA").decode()
        assert "fastrebalance/py.typed" in names
    assert licence == (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "Copyright 2026 the fastrebalance authors" in notice
    headers = metadata.split("\n\n", 1)[0].splitlines()
    for line in (
        f"Version: {VERSION}",
        "License-Expression: Apache-2.0",
        "License-File: LICENSE",
        "License-File: NOTICE",
        "Requires-Python: >=3.10",
        "Classifier: Typing :: Typed",
        "Classifier: Development Status :: 4 - Beta",
        "Classifier: Topic :: System :: Distributed Computing",
        *(f"Classifier: Programming Language :: Python :: 3.{m}" for m in (10, 11, 12, 13)),
        *(f"Provides-Extra: {e}" for e in ("spark", "prometheus", "otel", "schemaregistry")),
    ):
        assert line in headers, line
    urls = {line.split(", ", 1)[0] for line in headers if line.startswith("Project-URL: ")}
    wanted = ("Homepage", "Documentation", "Changelog", "Issues")
    assert urls == {f"Project-URL: {k}" for k in wanted}


def test_the_sdist_carries_docs_examples_tests_and_the_licence(built: Built) -> None:
    top = f"fastrebalance-{VERSION}"
    with tarfile.open(built.sdist) as sdist:
        names = {n.removeprefix(top + "/") for n in sdist.getnames()}
        licence = sdist.extractfile(f"{top}/LICENSE")
        assert licence is not None and licence.read().decode() == (ROOT / "LICENSE").read_text()
    for name in SDIST_FILES:
        assert name in names, name
    for tree in SDIST_TREES:
        wanted = {
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / tree).rglob("*")
            if p.is_file()
            and not _NOT_SOURCES & set(p.relative_to(ROOT).parts)
            and p.suffix != ".pyc"
        }
        assert wanted, tree
        assert not wanted - names, sorted(wanted - names)
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]


def test_the_wheel_alone_runs_in_a_fresh_venv(built: Built, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    fresh_site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True, env=_clean_env(),
        ).stdout.strip()
    )  # fmt: skip
    # the dependencies (confluent-kafka, pyspark, ...) without downloading them
    (fresh_site / "project_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--disable-pip-version-check", "--quiet", str(built.wheel)],
        capture_output=True, text=True, env=_clean_env(),
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    cwd = tmp_path / "elsewhere"  # not the checkout: '' on sys.path must not find the sources
    cwd.mkdir()

    cli = subprocess.run(
        [str(venv / "bin" / "fastrebalance"), "--help"],
        capture_output=True, text=True, cwd=cwd, env=_clean_env(), timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "usage: fastrebalance" in cli.stdout

    probe = (
        "import os, sys, importlib.metadata as md, fastrebalance, fastrebalance.spark\n"
        "print(fastrebalance.__file__)\n"
        "print(fastrebalance.spark.__file__)\n"
        "print(fastrebalance.__version__, md.version('fastrebalance'))\n"
        "print(any(os.path.realpath(p or '.') == sys.argv[1] for p in sys.path))\n"
    )
    run = subprocess.run(
        [str(python), "-c", probe, str(ROOT)],
        capture_output=True, text=True, cwd=cwd, env=_clean_env(), timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    package, spark, versions, sees_checkout = run.stdout.splitlines()
    assert Path(package).is_relative_to(venv), package
    assert Path(spark).is_relative_to(venv), spark
    assert versions == f"{VERSION} {VERSION}"
    assert sees_checkout == "False"
