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

The wheel is also installed beside the core dependencies alone (a directory of links to
confluent-kafka's, tenacity's and sortedcontainers' installed files, nothing of the extras),
where pip's own check must pass and ``fastrebalance demo`` must run on the embedded cluster:
what ``pip install fastrebalance`` and ``make demo`` give a user. ``twine check --strict``
reads both files' metadata as a package index would (docs/releasing.md).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

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


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter's pip acting on another venv (the fresh ones have none)."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args,
         "--disable-pip-version-check"],
        capture_output=True, text=True, env=_clean_env(), timeout=120,
    )  # fmt: skip


def _fresh_venv(venv: Path, deps: Path, wheel: Path) -> Path:
    """A venv without pip holding ``wheel`` alone, ``deps`` appended to its path; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    fresh_site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True, env=_clean_env(),
        ).stdout.strip()
    )  # fmt: skip
    (fresh_site / "project_deps.pth").write_text(f"{deps}\n")
    install = _pip(python, "install", "--no-deps", "--no-index", "--quiet", str(wheel))
    assert install.returncode == 0, install.stdout + install.stderr
    return python


def _core_dependencies(into: Path) -> list[str]:
    """Links in ``into`` to the installed files of fastrebalance's dependencies without any
    extra, and of theirs: the top-level modules, packages and ``.dist-info`` of each (what
    ``pip install fastrebalance`` puts beside it). Their names."""
    into.mkdir()
    names: list[str] = []
    todo = ["fastrebalance"]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        for text in dist.requires or ():
            req = Requirement(text)
            wanted = req.marker is None or req.marker.evaluate({"extra": ""})
            if wanted and req.name not in names:
                names.append(req.name)
                todo.append(req.name)
        if dist.metadata["Name"] == "fastrebalance":
            continue  # the wheel brings it
        tops = {f.parts[0] for f in dist.files or () if f.parts[0] not in ("..", "__pycache__")}
        for top in tops:
            if not (into / top).exists():
                (into / top).symlink_to(Path(str(dist.locate_file(top))))
    return names


def test_the_wheel_alone_runs_in_a_fresh_venv(built: Built, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # the dependencies (confluent-kafka, pyspark, ...) without downloading them
    python = _fresh_venv(venv, Path(sysconfig.get_path("purelib")), built.wheel)
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


def test_the_wheel_with_the_core_dependencies_alone_runs_the_demo(
    built: Built, tmp_path: Path
) -> None:
    """What ``pip install fastrebalance`` gives, and ``make demo`` installs (editable): no
    extra. The demo on the embedded cluster must neither import nor need one."""
    deps = tmp_path / "core"
    names = _core_dependencies(deps)
    assert {"confluent-kafka", "tenacity", "sortedcontainers"} <= set(names), names
    python = _fresh_venv(tmp_path / "venv", deps, built.wheel)
    check = _pip(python, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    extras = ("pyspark", "pyarrow", "pandas", "prometheus_client", "opentelemetry", "matplotlib",
              "fastavro", "hypothesis", "pytest")  # fmt: skip
    probe = f"import importlib.util; print([m for m in {extras!r} if importlib.util.find_spec(m)])"
    seen = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=cwd, env=_clean_env(),
        timeout=60,
    )  # fmt: skip
    assert seen.stdout.strip() == "[]", seen.stdout + seen.stderr  # no extra to lean on
    demo = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "fastrebalance"), "demo", "--backlog", "20000",
         "--work-us", "200", "--tail", "0.5"],
        capture_output=True, text=True, cwd=cwd, env=_clean_env(), timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "time to first fresh record" in demo.stdout
    assert "lost: 0" in demo.stdout
    assert "embedded cluster at 127.0.0.1:" in demo.stdout


def test_twine_check_passes_on_both_files(built: Built) -> None:
    """The metadata a package index reads (the README as the long description, the licence
    expression, the URLs): ``--strict`` fails on warnings too."""
    pytest.importorskip("twine")
    run = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("PASSED") == 2, run.stdout


def test_the_version_is_written_once_and_the_changelog_dates_it() -> None:
    """pyproject.toml reads the version from fastrebalance/__init__.py; CHANGELOG.md has an
    Unreleased section for what comes next, then a dated section for this version, with the
    links Keep a Changelog puts at the end."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    assert not re.search(r"^version\s*=\s*[\"']", pyproject, re.MULTILINE)  # a literal
    assert 'version = { attr = "fastrebalance.__version__" }' in pyproject
    sources = [p for p in (ROOT / "fastrebalance").rglob("*.py") if VERSION in p.read_text()]
    assert sources == [ROOT / "fastrebalance" / "__init__.py"], sources
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.*)$", changelog, re.MULTILINE)
    assert headings[0] == "[Unreleased]", headings
    assert re.fullmatch(rf"\[{re.escape(VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}", headings[1])
    assert f"[{VERSION}]: " in changelog and "[Unreleased]: " in changelog


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_demo_installs_the_core_package_alone_and_make_test_every_extra(
    tmp_path: Path,
) -> None:
    """What the two commands of the README would install (``make -n``: nothing runs). The
    demo had every extra, pyspark among them (1.1 GB, 1 min 36 s before its table); it needs
    none (the wheel test above runs it without)."""

    def plan(target: str, **variables: str) -> list[str]:
        given = [f"{k}={v}" for k, v in variables.items()]
        run = subprocess.run(["make", "-n", "-C", str(ROOT), target, *given],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        return [line for line in run.stdout.splitlines() if " install " in line]

    demo = [target for line in plan("demo", DEMO_VENV=str(tmp_path / "demo"))
            for target in re.findall(r" -e ([^\s;]+)", line)]  # fmt: skip
    assert demo and set(demo) == {"."}, demo  # the package, no extra: '.[...]'
    test = [target for line in plan("test", VENV=str(tmp_path / "all"))
            for target in re.findall(r" -e ([^\s;]+)", line)]  # fmt: skip
    assert test == ["'.[test,docs,spark,prometheus,otel,schemaregistry,plot]'"], test
