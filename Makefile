# The two set-up commands of the README: `make demo` and `make test` (ruff, the import layers, pytest).
PY ?= python3
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

# Oracles that cannot share the project's environment, each in its own venv beside it (the tests run them in a
# subprocess; without one its tests skip): Hugging Face's TransfoXLLMHeadModel lives only in transformers 4.x
# (tests/test_import_transformer_xl.py); fairseq 0.12's Transformer runs from its source release, unbuilt (its C++
# and Cython parts serve training and are never used; tests/test_import_fairseq.py), fetched from PyPI and checked
ORACLE := build/oracles/transformers4
FAIRSEQ := build/oracles/fairseq
FAIRSEQ_SDIST := https://files.pythonhosted.org/packages/7e/e9/df8fe7f34cfb7dbaacdb7a288813cad22491a32ea278820268ee34ac57ec/fairseq_fixed-0.12.3.1.tar.gz
FAIRSEQ_SHA256 := c607577a54ab30e2ee0f0b0a754ea5cdbc6ad0a9f99a1726638a2201445bc1cc

.PHONY: install oracles demo test lint
install:
	$(PIP) torch==2.13.0
	$(PIP) -e ".[test]"

oracles: $(ORACLE)/bin/python $(FAIRSEQ)/bin/python
$(ORACLE)/bin/python:
	$(PY) -m venv --system-site-packages $(ORACLE).tmp
	$(ORACLE).tmp/bin/python -m pip install --quiet --disable-pip-version-check "transformers==4.46.3" "sacremoses==0.2.0"
	rm -rf $(ORACLE) && mv $(ORACLE).tmp $(ORACLE)
$(FAIRSEQ)/bin/python:
	rm -rf $(FAIRSEQ).tmp && $(PY) -m venv --system-site-packages $(FAIRSEQ).tmp
	$(FAIRSEQ).tmp/bin/python -m pip install --quiet --disable-pip-version-check "hydra-core==1.3.2" \
		"omegaconf==2.3.0" "bitarray==3.12.3" "regex==2026.5.9" "scikit-learn==1.9.1"
	curl -sSfL -o $(FAIRSEQ).tmp/fairseq.tar.gz $(FAIRSEQ_SDIST)
	echo "$(FAIRSEQ_SHA256)  $(FAIRSEQ).tmp/fairseq.tar.gz" | sha256sum --check --quiet
	tar -xzf $(FAIRSEQ).tmp/fairseq.tar.gz -C $(FAIRSEQ).tmp && rm $(FAIRSEQ).tmp/fairseq.tar.gz
	echo "../../../fairseq_fixed-0.12.3.1" > $$($(FAIRSEQ).tmp/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")/fairseq-source.pth
	rm -rf $(FAIRSEQ) && mv $(FAIRSEQ).tmp $(FAIRSEQ)

demo: install
	$(PY) -m attnkit demo --force

lint:
	$(PY) -m ruff check src tests $(wildcard benchmarks)
	lint-imports --no-logo

test: install oracles lint
	$(PY) -m pytest
