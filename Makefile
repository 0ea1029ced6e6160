# The two set-up commands of the README: `make demo` and `make test` (ruff, the import layers, pytest).
PY ?= python3
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

# Oracles that cannot share the project's environment: Hugging Face's TransfoXLLMHeadModel lives only in
# transformers 4.x (tests/test_import_transformer_xl.py runs it in a subprocess; without it those tests skip)
ORACLE := build/oracles/transformers4

.PHONY: install oracles demo test lint
install:
	$(PIP) torch==2.13.0
	$(PIP) -e ".[test]"

oracles: $(ORACLE)/bin/python
$(ORACLE)/bin/python:
	$(PY) -m venv --system-site-packages $(ORACLE).tmp
	$(ORACLE).tmp/bin/python -m pip install --quiet --disable-pip-version-check "transformers==4.46.3" "sacremoses==0.2.0"
	rm -rf $(ORACLE) && mv $(ORACLE).tmp $(ORACLE)

demo: install
	$(PY) -m attnkit demo --force

lint:
	$(PY) -m ruff check src tests $(wildcard benchmarks)
	lint-imports --no-logo

test: install oracles lint
	$(PY) -m pytest
