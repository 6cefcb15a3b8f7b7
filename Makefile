# The two commands a newcomer runs (see README.md):
#   make quickstart   create/update .venv, then run the main job
#   make test         create/update .venv, then run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= quickstart
PYTEST_ARGS ?=

.PHONY: setup quickstart test lint

setup:
	@bash scripts/setup.sh

quickstart: setup
	$(VENV)/bin/kimi-vl quickstart --out $(OUT)

test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
