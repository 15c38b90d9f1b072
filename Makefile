# The two commands of the README. Each creates/refreshes .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test lint docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,docs,spark,prometheus,otel]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fastrebalance demo

lint: $(STAMP)
	$(VENV)/bin/ruff check fastrebalance tests examples benchmarks
	$(VENV)/bin/mypy

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict -f docs/mkdocs/mkdocs.yml

test: $(STAMP) lint
	$(PY) -m pytest -q -ra --durations=15

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .site
