# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# The CPU build of torch 2.13.0 is installed first: a plain `torch` requirement
# would pull several GB of CUDA packages.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0

.PHONY: demo test lint install clean mutation

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[train,dev,text,vqa,video]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/polyfuse demo

test: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check src tests

# Mutation testing, one module or several (not part of `make test`; docs/TESTING.md):
#   make mutation MODULE=polyfuse.nn.man        (default: every module of the map)
#   make mutation MODULE=polyfuse.nn.man ONLY='polyfuse.nn.man.xǁMANǁ_fuse__mutmut_*'
MODULE ?=
JOBS ?= 1
ONLY ?=
mutation: $(STAMP)
	$(BIN)/python scripts/mutation.py $(MODULE) --jobs $(JOBS) $(if $(ONLY),--only '$(ONLY)')

clean:
	rm -rf $(VENV) build dist *.egg-info mutants
