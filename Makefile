# The two commands of the README. Each creates/refreshes .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test test-kafka lint docs clean

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

# The same suite against a real Apache Kafka started from a local distribution (the project's
# kafka-up/kafka-down scripts, as in ../shared/kafka), stopped and wiped afterwards. Tests that
# pause or stop a broker start their own from it. Any other broker: FASTREBALANCE_TEST_BOOTSTRAP.
KAFKA_HOME ?= ../shared/kafka
KAFKA_PORT ?= 19092
test-kafka: $(STAMP)
	@dir=$$(mktemp -d) && bs=$$($(KAFKA_HOME)/bin/kafka-up $(KAFKA_PORT) $$dir) && \
	echo "Apache Kafka at $$bs" && \
	FASTREBALANCE_TEST_BOOTSTRAP=$$bs FASTREBALANCE_KAFKA_HOME=$(KAFKA_HOME) \
	  $(PY) -m pytest -q -ra --durations=15; \
	rc=$$?; $(KAFKA_HOME)/bin/kafka-down $(KAFKA_PORT) $$dir --wipe; exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .site
