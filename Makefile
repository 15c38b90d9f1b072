# The two commands of the README. Each creates/refreshes its virtualenv and installs what it
# needs: make demo the core install alone in .venv-demo (confluent-kafka, tenacity,
# sortedcontainers: about 45 MB, what `pip install fastrebalance` brings), make test and the
# rest every extra in .venv (pyspark among them, about 1 GB).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CKSUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(CKSUM)
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed-$(CKSUM)

.PHONY: demo test test-kafka test-kafka4 _suite lint docs clean

# --no-compile: byte-compiling every installed module (pyspark's thousands) took 33 of the
# install's 66 s; Python compiles what it imports, once, on first use.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[test,docs,spark,prometheus,otel,schemaregistry,plot]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# The demo imports nothing of the extras (tests/unit/test_packaging.py runs it from the wheel
# with the core dependencies alone). The venv gets no pip of its own: ensurepip byte-compiles
# pip's thousand modules, which took 23 s of a loaded machine's minute; this Python's pip
# installs into it (--python, pip 22.3+). Without such a pip, the venv's own, at least 21.3
# (the first to install a pyproject-only package editable).
DEMO_INSTALL := install --quiet --no-compile -e .
$(DEMO_STAMP): pyproject.toml
	test -x $(DEMO_VENV)/bin/python || $(PYTHON) -m venv --without-pip $(DEMO_VENV)
	$(PYTHON) -m pip --python $(DEMO_VENV)/bin/python $(DEMO_INSTALL) 2>/dev/null \
	|| { $(DEMO_VENV)/bin/python -m ensurepip --upgrade \
	     && $(DEMO_VENV)/bin/python -m pip install --quiet 'pip>=21.3' \
	     && $(DEMO_VENV)/bin/python -m pip $(DEMO_INSTALL); }
	rm -f $(DEMO_VENV)/.installed-* && touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/fastrebalance demo

lint: $(STAMP)
	$(VENV)/bin/ruff check fastrebalance tests examples benchmarks
	$(VENV)/bin/mypy

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict -f docs/mkdocs/mkdocs.yml

# Four pytest-xdist workers (tests/conftest.py says why and what never runs side by side),
# then the tests marked alone, which load the machine themselves, after them (see suite).
# WORKERS=0 runs everything in one process.
WORKERS ?= 4
XDIST := $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadgroup)
PYTEST := $(PY) -m pytest -q -ra --durations=15

#: The modules of the tests marked alone: their run collects only these (collecting the whole
#: suite again, Spark modules included, took each of its workers ~20 s).
ALONE_FILES := $(shell grep -rl 'pytest.mark.alone' tests --include='test_*.py')

# $(1): a marker expression (empty: every test), $(2): paths, $(3): pytest-xdist options for
# the tests marked alone (none: one at a time, each with its two busy processes; with them,
# side by side with one each, so that the machine carries the two busy processes each slice
# was written for). Both runs happen; the recipe fails if either did (pytest's 5, "no test
# selected", is not a failure here).
define suite
	@$(PYTEST) $(XDIST) -m "not alone$(if $(1), and ($(1)))" $(2); a=$$?; \
	$(if $(3),FASTREBALANCE_CHAOS_HOGS=1 )$(PYTEST) $(3) -m "alone$(if $(1), and ($(1)))" \
		$(filter $(2)%,$(ALONE_FILES)); b=$$?; \
	for rc in $$a $$b; do [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc; done
endef

# make test selects both chaos slices marked alone (102 s side by side in stop 40's CI).
test: $(STAMP) lint
	$(call suite,,,$(if $(filter 0,$(WORKERS)),,-n 2 --dist loadgroup))

# The suite's broker-facing part against a real Apache Kafka started from a local distribution
# (its kafka-up/kafka-down scripts, as in ../shared/kafka), stopped and wiped afterwards; tests
# that pause or stop a broker start their own from it. The unit tests and the docs check do
# not touch a broker: make test ran them. Any other broker: FASTREBALANCE_TEST_BOOTSTRAP.
#   test-kafka:  Apache Kafka 3.9, tests/integration;
#   test-kafka4: Apache Kafka 4 with the consumer protocol, the tests marked kafka4 (their
#                behaviour depends on the group protocol or the broker generation).
# Three workers there, not four: the Spark crash harness runs there (a CPU-bound chain), and
# beside three other workers its setup took 478 s and the Kafka 3.9 pass 1,024 s; with two
# others, 241 s and 765 s (the same code, a quiet machine).
BROKER_WORKERS ?= 3
KAFKA_HOME ?= ../shared/kafka
KAFKA_PORT ?= 19092
KAFKA4_HOME ?= ../shared/kafka4
KAFKA4_PORT ?= 19192

# $(1): the distribution, $(2): its port, $(3): what pytest runs
# $(1): the distribution, $(2): its port, $(3): a marker expression, as in suite
define on_broker
	@dir=$$(mktemp -d) && bs=$$($(1)/bin/kafka-up $(2) $$dir) && \
	echo "Apache Kafka from $(1) at $$bs" && \
	export FASTREBALANCE_TEST_BOOTSTRAP=$$bs FASTREBALANCE_KAFKA_HOME=$(1) && \
	$(MAKE) --no-print-directory _suite MARKS="$(3)" PATHS=tests/integration WORKERS=$(BROKER_WORKERS); \
	rc=$$?; $(1)/bin/kafka-down $(2) $$dir --wipe; exit $$rc
endef

test-kafka: $(STAMP)
	$(call on_broker,$(KAFKA_HOME),$(KAFKA_PORT),)

test-kafka4: $(STAMP)
	$(call on_broker,$(KAFKA4_HOME),$(KAFKA4_PORT),kafka4)

_suite:
	$(call suite,$(MARKS),$(PATHS))

clean:
	rm -rf $(VENV) $(DEMO_VENV) .pytest_cache .hypothesis .site
