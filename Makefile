# A thin shell over nox. `make` alone prints this help.
# nox comes from a pinned tool venv (.tools/) when it is not already on PATH. Never put
# .tools/bin on PATH: its python3 would shadow yours. .tools/nox-only/ holds nothing but a
# link to nox, for `export PATH="$PWD/.tools/nox-only:$PATH"`.
PYTHON ?= python3
TOOLS := .tools
NOX := $(if $(shell command -v nox 2>/dev/null),nox,$(TOOLS)/bin/nox)
NOX_PIN := nox==2026.10.20
# With pyenv, the kit's Pythons 3.10-3.13 are put on PATH for the tests, as CI does (see
# .ci/kit-pythons). A kit Python nox cannot find is skipped in one line; with CI set (as
# .ci/run sets it) it fails `make test`.
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

# The kit sessions (a venv and the kit tests on each of four Pythons, about a minute) run
# beside lint and the suite, whose environment pip builds with one core idle; their output
# is shown once the suite is done, and make test fails if either fails.
KIT_LOG := .nox/kit-sessions.log
WITH_KIT_PYTHONS := $(if $(KIT_PYENV),PYENV_VERSION=$(KIT_PYENV) )

.PHONY: test
test: nox  ## Lint, then run the tests (CPU torch) and the kit tests on Python 3.10-3.13
	$(if $(KIT_PYENV),@echo "Python versions on PATH: $(KIT_PYENV)")
	@echo "$(WITH_KIT_PYTHONS)$(NOX) -s kit > $(KIT_LOG) (beside the suite: shown after it)"
	@mkdir -p .nox; \
	$(WITH_KIT_PYTHONS)$(NOX) -s kit > $(KIT_LOG) 2>&1 & kit=$$!; \
	trap 'pkill -TERM -P $$kit; kill $$kit 2>/dev/null; exit 130' INT TERM; \
	echo "$(WITH_KIT_PYTHONS)$(NOX) -s lint tests"; \
	$(WITH_KIT_PYTHONS)$(NOX) -s lint tests; suite=$$?; \
	wait $$kit; kit_status=$$?; \
	cat $(KIT_LOG); \
	if [ $$kit_status -ne 0 ]; then echo "make test: the kit sessions failed (output above)" >&2; fi; \
	if [ $$suite -ne 0 ]; then echo "make test: lint or the suite failed" >&2; exit $$suite; fi; \
	exit $$kit_status

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
