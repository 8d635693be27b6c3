# A thin shell over nox. `make` alone prints this help.
# nox comes from a pinned tool venv (.tools/) when it is not already on PATH. Never put
# .tools/bin on PATH: its python3 would shadow yours. .tools/nox-only/ holds nothing but a
# link to nox, for `export PATH="$PWD/.tools/nox-only:$PATH"`.
PYTHON ?= python3
TOOLS := .tools
NOX := $(if $(shell command -v nox 2>/dev/null),nox,$(TOOLS)/bin/nox)
NOX_PIN := nox==2026.10.20
# With pyenv, the kit's Pythons 3.10-3.13 are put on PATH for the tests, as CI does (see
# .ci/kit-pythons); a kit Python nox cannot find fails `make test`.
KIT_PYENV = $(shell .ci/kit-pythons 2>/dev/null)

.DEFAULT_GOAL := help

.PHONY: help
help:  ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(TOOLS)/bin/nox:
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet --disable-pip-version-check "$(NOX_PIN)"

$(TOOLS)/nox-only/nox: | $(TOOLS)/bin/nox
	mkdir -p $(TOOLS)/nox-only
	ln -sfn ../bin/nox $@

.PHONY: nox
nox: $(if $(filter nox,$(NOX)),,$(TOOLS)/nox-only/nox)  ## Bootstrap nox into .tools/ (see README)

.PHONY: test
test: nox  ## Lint, then run the tests (CPU torch) and the kit tests on Python 3.10-3.13
	$(if $(KIT_PYENV),@echo "Python versions on PATH: $(KIT_PYENV)")
	$(if $(KIT_PYENV),PYENV_VERSION=$(KIT_PYENV) )$(NOX) -s lint tests kit

.PHONY: archive
archive: nox  ## Build dist/iteragpu-lab-v1.zip and MANIFEST.json (no GPU; never overwrites)
	$(NOX) -s archive

.PHONY: verify
verify: nox  ## Check the kit against MANIFEST.json (KIT=dist/iteragpu-lab-v1.zip for a copy)
	$(NOX) -s verify -- $(KIT)

.PHONY: measure
measure: nox  ## Measure on a GPU into runs/<id>/ (DEVICE=cuda:0, ARGS="--width 1024 ...")
	$(NOX) -s measure -- --device $(or $(DEVICE),cuda:0) $(ARGS)

.PHONY: clean
clean:  ## Remove caches only (never runs/, data/ or dist/)
	rm -rf .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -not -path './.nox/*' -not -path './.tools/*' -exec rm -rf {} +
