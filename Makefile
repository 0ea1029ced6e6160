# The two set-up commands of the README: `make demo` and `make test` (ruff, the import layers, pytest).
PY ?= python3
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: install demo test lint
install:
	$(PIP) torch==2.13.0
	$(PIP) -e ".[test]"

demo: install
	$(PY) -m attnkit demo --force

lint:
	$(PY) -m ruff check src tests $(wildcard benchmarks)
	lint-imports --no-logo

test: install lint
	$(PY) -m pytest
