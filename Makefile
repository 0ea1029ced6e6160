# The two set-up commands of the README: `make demo` and `make test` (ruff, the import layers, pytest).
PY ?= python3
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# torch 2.13.0 from the default index is the CUDA build on Linux; a CPU-only machine names PyTorch's CPU wheel index
# here (`make demo TORCH_INDEX=...`, README "Set up"). Empty: pip's own configuration decides.
TORCH_INDEX ?=
# Extra arguments for pytest in `make test` (e.g. PYTEST_ARGS="-k fairseq"), and the paths ruff checks.
PYTEST_ARGS ?=
LINT_PATHS ?= src tests $(wildcard benchmarks)

# Oracles that cannot share the project's environment, each in its own venv beside it (the tests run them in a
# subprocess; without one its tests skip): Hugging Face's TransfoXLLMHeadModel lives only in transformers 4.x
# (tests/test_import_transformer_xl.py); fairseq 0.12's Transformer runs from its source release, unbuilt (its C++
# and Cython parts serve training and are never used; tests/test_import_fairseq.py), which pip downloads and the
# recipe checks against FAIRSEQ_SHA256.
ORACLE := build/oracles/transformers4
FAIRSEQ := build/oracles/fairseq
TRANSFORMERS4_PACKAGES := "transformers==4.46.3" "sacremoses==0.2.0"
# setuptools: pip reads the source release's metadata with it (no build isolation, which would build torch, numpy
# and Cython from source under --no-binary :all:)
FAIRSEQ_PACKAGES := "hydra-core==1.3.2" "omegaconf==2.3.0" "bitarray==3.12.3" "regex==2026.5.9" \
	"scikit-learn==1.9.1" "setuptools==84.2.1"
FAIRSEQ_VERSION := 0.12.3.1
FAIRSEQ_SHA256 := c607577a54ab30e2ee0f0b0a754ea5cdbc6ad0a9f99a1726638a2201445bc1cc
ORACLE_PIP = $(1)/bin/python -m pip --quiet --disable-pip-version-check

# An oracle's venv sees, after its own packages (so its pinned transformers 4.x wins), those of the interpreter make
# runs with: $(PY)'s site-packages, user site first as in $(PY) itself, named in py-packages.pth. `venv
# --system-site-packages` would not do: its "system" is the base interpreter, not the venv $(PY) may be (the
# README's), whose torch the oracle then misses (tests/test_install.py). Written to a temporary file and renamed;
# rewritten by every `make oracles`, so an oracle follows the interpreter of the latest run.
WRITE_SITE_PTH := import os, pathlib, site, sys; \
	pth = pathlib.Path(sys.argv[1]); tmp = pth.with_name(pth.name + '.tmp'); \
	dirs = ([site.getusersitepackages()] if site.ENABLE_USER_SITE else []) + site.getsitepackages(); \
	tmp.write_text(''.join(d + '\n' for d in dirs)); os.replace(tmp, pth)
PURELIB := import sysconfig; print(sysconfig.get_path('purelib'))
define see_py_packages
	$(PY) -c "$(WRITE_SITE_PTH)" "$$($(1)/bin/python -c "$(PURELIB)")/py-packages.pth"
endef

.PHONY: install oracles oracle-transformers4 oracle-fairseq demo test lint
install:
	$(PIP) torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) -e ".[test]"

oracles: oracle-transformers4 oracle-fairseq
oracle-transformers4: $(ORACLE)/bin/python
	$(call see_py_packages,$(ORACLE))
oracle-fairseq: $(FAIRSEQ)/bin/python
	$(call see_py_packages,$(FAIRSEQ))

$(ORACLE)/bin/python:
	rm -rf $(ORACLE).tmp && $(PY) -m venv $(ORACLE).tmp
	$(call see_py_packages,$(ORACLE).tmp)
	$(call ORACLE_PIP,$(ORACLE).tmp) install $(TRANSFORMERS4_PACKAGES)
	rm -rf $(ORACLE) && mv $(ORACLE).tmp $(ORACLE)
$(FAIRSEQ)/bin/python:
	rm -rf $(FAIRSEQ).tmp && $(PY) -m venv $(FAIRSEQ).tmp
	$(call see_py_packages,$(FAIRSEQ).tmp)
	$(call ORACLE_PIP,$(FAIRSEQ).tmp) install $(FAIRSEQ_PACKAGES)
	$(call ORACLE_PIP,$(FAIRSEQ).tmp) download --no-deps --no-binary :all: --no-build-isolation \
		-d $(FAIRSEQ).tmp "fairseq-fixed==$(FAIRSEQ_VERSION)"
	echo "$(FAIRSEQ_SHA256)  $(FAIRSEQ).tmp/fairseq_fixed-$(FAIRSEQ_VERSION).tar.gz" | sha256sum --check --quiet
	tar -xzf $(FAIRSEQ).tmp/fairseq_fixed-$(FAIRSEQ_VERSION).tar.gz -C $(FAIRSEQ).tmp
	rm $(FAIRSEQ).tmp/fairseq_fixed-$(FAIRSEQ_VERSION).tar.gz
	echo "../../../fairseq_fixed-$(FAIRSEQ_VERSION)" > "$$($(FAIRSEQ).tmp/bin/python -c "$(PURELIB)")/fairseq-source.pth"
	rm -rf $(FAIRSEQ) && mv $(FAIRSEQ).tmp $(FAIRSEQ)

demo: install
	$(PY) -m attnkit demo --force

lint:
	$(PY) -m ruff check $(LINT_PATHS)
	lint-imports --no-logo

# The oracles are optional: where one cannot be built (no registry, a failed install) make says so in one line, its
# tests skip, and `make test` still runs ruff, lint-imports and pytest (tests/test_install.py).
test: install lint
	$(MAKE) --no-print-directory -k oracles \
		|| echo "note: an oracle could not be built (see above); the tests that need it will be skipped"
	$(PY) -m pytest $(PYTEST_ARGS)
