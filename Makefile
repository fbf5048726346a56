# inagg: make demo | make test | make bench
# Variables: PYTHON (interpreter that creates the venv), VENV, TORCH_VERSION, DEMO_ARGS, PYTEST_ARGS.

PYTHON        ?= python3
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
BIN           := $(VENV)/bin
STAMP         := $(VENV)/.inagg-installed

.PHONY: all setup demo test bench build clean

all: demo

# The virtual environment with inagg (editable), its test tools and a CPU build of torch.
# On a bare Debian, python3-venv is installed first (needs root).
$(STAMP): pyproject.toml
	@$(PYTHON) -c "import ensurepip" 2>/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq python3-venv python3-pip)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -e ".[dev,torch]"
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/inagg-demo $(DEMO_ARGS)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/python benchmarks/allreduce_bench.py
	$(BIN)/python benchmarks/dataplane_bench.py

clean:
	rm -rf build logs pcaps benchmarks/results .pytest_cache .hypothesis

# Compile the P4 program and refresh the committed BMv2 JSON + P4Info (needs p4c).
P4C ?= p4c-bm2-ss
build:
	$(P4C) --arch v1model --p4runtime-files p4/inagg.p4info.txtpb -o p4/inagg.json p4/inagg.p4
