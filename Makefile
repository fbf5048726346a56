# inagg: make demo | make test | make bench | make run / stop / clean | make build
# Variables: PYTHON (interpreter that creates the venv), VENV, TORCH_VERSION, DEMO_ARGS, PYTEST_ARGS,
#            TEST_JOBS (make test: pytest-xdist workers, one test file each at a time; 1 = serial), QUICK (bench subset),
#            TOPO (topology file), DATAPLANE (auto|bmv2|soft), EPOCHS (override jobs' epochs),
#            TRANSPORT (udp|roce: override jobs' transport to the switch), CLI (1: stay at a
#            mininet> prompt after the jobs; during: a prompt while they run), RUN (make stop: only this run id), ALL (make stop/clean:
#            every user's runs, not only yours), ARGS (make ctl),
#            SOFT_VALUES_PER_PACKET (K of the software target's P4Info, make build),
#            P4_DEFINES (make build: -D flags; the build goes to build/p4/bmv2-<defines>/, p4/out/ untouched),
#            KEEP_RUNS (make run: finished runs of yours kept beside a new one, default 3),
#            BMV2_LOG (make run: BMv2's log level, default info; trace as in p4lang/tutorials),
#            WIRE_ARGS (make bench-wire: benchmarks/wire_bench.py's options),
#            TREE_ARGS (make bench-tree: benchmarks/tree_bench.py's options),
#            TRAIN_ARGS (make bench-train: benchmarks/train_bench.py's options: --bw-schedule S:MBIT,...
#            for a rate that changes mid-run, --steps/--target/--until-target to size a run to a target accuracy),
#            FIG_ARGS (make fig-*: the figure script's options), MAX_LOAD (make fig-*: the quiet machine's
#            1-minute load, default 1.0; LOADED=mark runs above it and marks the figure "not quiet"),
#            TESTGEN_TARGETS (make testgen: bmv2 tofino tofino2 by default).

PYTHON        ?= python3
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
BIN           := $(VENV)/bin
STAMP         := $(VENV)/.inagg-installed

P4C           ?= p4c-bm2-ss
BF_P4C        ?= bf-p4c
TOPO          ?= bmv2_env/emulation/topologies/single_switch.json
DATAPLANE     ?= auto
EPOCHS        ?=
TRANSPORT     ?=
CLI           ?=
RUN           ?=
ALL           ?=
KEEP_RUNS     ?=
BMV2_LOG      ?=
P4_DEFINES    ?=
TEST_JOBS     ?= 2
ARGS          ?= top
P4_BUILD      := build/p4/bmv2
P4_OUT        := p4/out
HAVE_P4C      := $(shell command -v $(P4C) 2>/dev/null)

.PHONY: all run stop ctl setup setup-emulation demo test bench bench-wire bench-tree bench-train build tofino testgen clean protos \
	fig-workers fig-loss fig-tenants fig-tree

# As in p4lang/tutorials: `make` = `make run`.
all: run

# The virtual environment with inagg (editable, its C++ data path compiled into build/), its test
# tools and a CPU build of torch. On a bare Debian, what a venv and the C++ build need (venv/pip,
# Python's headers, a C++ compiler, CMake) is installed first (needs root).
# The build tools live in the venv (no build isolation) so a C++ change rebuilds incrementally.
$(STAMP): pyproject.toml CMakeLists.txt $(wildcard native/*.cpp native/*.hpp)
	@$(PYTHON) -c "import ensurepip, sysconfig, os.path as p; \
	  assert p.exists(p.join(sysconfig.get_path('include'), 'Python.h'))" 2>/dev/null && \
	  command -v c++ >/dev/null && command -v cmake >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq python3-venv python3-pip python3-dev g++ cmake)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)" "scikit-build-core>=0.10" "nanobind>=2.0"
	$(BIN)/pip install -q --no-build-isolation -e ".[dev,torch,control]"
	touch $@

setup: $(STAMP)

# Mininet (Debian's package; Open vSwitch is not needed) and ethtool, for `make run`; tshark for
# the Wireshark dissector's test. Without root those tests skip, so this only installs when it can.
setup-emulation: setup
	@command -v mnexec >/dev/null && command -v ethtool >/dev/null && command -v tshark >/dev/null || \
	  [ "$$(id -u)" != 0 ] || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends mininet ethtool tshark)

# Compile into build/p4/bmv2 when p4c is present (BMv2 runs that; else, and on the software data
# plane, the committed JSON/P4Info in p4/out/bmv2/), then bring up the topology, the controller,
# the host aggregator and the jobs in a run directory of its own (build/emulation/<run id>);
# prints a per-job summary.
run: setup-emulation $(if $(HAVE_P4C),$(P4_BUILD)/inagg.json)
	$(BIN)/python -m inagg.bmv2_env.emulation.mininet_run --topo $(TOPO) --dataplane $(DATAPLANE) \
	  $(if $(and $(HAVE_P4C),$(filter-out soft,$(DATAPLANE))),--p4info $(P4_BUILD)/inagg.p4info.txtpb --bmv2-json $(P4_BUILD)/inagg.json) \
	  $(if $(EPOCHS),--epochs $(EPOCHS)) $(if $(TRANSPORT),--transport $(TRANSPORT)) \
	  $(if $(CLI),--cli $(filter during,$(CLI))) \
	  $(if $(KEEP_RUNS),--keep-runs $(KEEP_RUNS)) $(if $(BMV2_LOG),--bmv2-log $(BMV2_LOG))

# A build folder keeps the -D flags it was made with (its `defines`), so a rebuild after a change
# to p4/ keeps them (make build P4_DEFINES=..., then make run P4_BUILD=build/p4/bmv2-...).
$(P4_BUILD)/inagg.json: p4/inagg.p4 $(wildcard p4/include/*.p4)
	mkdir -p $(P4_BUILD)
	$(P4C) --arch v1model $$(cat $(P4_BUILD)/defines 2>/dev/null) \
	  --p4runtime-files $(P4_BUILD)/inagg.p4info.txtpb -o $@ p4/inagg.p4

# Stop what your unfinished runs of this checkout started (the user behind sudo; ALL=1: every
# user's; RUN=<id>: only that one), by the PIDs and interface names recorded in their run directories.
stop:
	$(BIN)/python -m inagg.bmv2_env.emulation.mininet_run --stop $(if $(RUN),--run $(RUN)) $(if $(ALL),--all)

# inaggctl against the newest run (ARGS=top by default; e.g. make ctl ARGS=jobs).
ctl:
	@test -f build/emulation/latest/env || { if [ -e build/emulation/latest ]; then \
	  echo "make ctl: the newest run, $$(readlink build/emulation/latest), has ended and its controller with it" \
	    "(its summary: build/emulation/latest/summary.txt); make run CLI=1 keeps a run up for inaggctl" >&2; \
	  else echo "make ctl: no emulation run here (make run CLI=1 keeps one up for inaggctl)" >&2; fi; exit 2; }
	set -a && . build/emulation/latest/env && $(BIN)/inaggctl $(ARGS)

demo: setup
	$(BIN)/inagg-demo $(DEMO_ARGS)

test: setup-emulation
	$(BIN)/python -m pytest $(if $(filter-out 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

bench: setup
	$(BIN)/python benchmarks/backend_sweep.py $(if $(QUICK),--quick)
	$(BIN)/python benchmarks/allreduce_bench.py
	$(BIN)/python benchmarks/dataplane_bench.py
	$(BIN)/python benchmarks/controller_bench.py
	$(BIN)/python benchmarks/artopk_bench.py
	$(BIN)/python benchmarks/loss_bench.py
	$(BIN)/python benchmarks/train_step_bench.py
	$(BIN)/python benchmarks/wire_efficiency.py
	@$(call in_emulation,benchmarks/bandwidth_flip.py)
	@$(call in_emulation,benchmarks/wire_bench.py $(if $(QUICK),--quick))
	@$(call in_emulation,benchmarks/tree_bench.py $(if $(QUICK),--quick))

# The emulation's benchmarks need root and Mininet: without them, say so and go on.
in_emulation = if [ "$$(id -u)" = 0 ] && command -v mnexec >/dev/null; then $(BIN)/python $(1); \
	  else echo "$(firstword $(1)): needs root and Mininet (make setup-emulation): skipped"; fi

# inagg against gloo's ring on shaped links (100 Mbit/s; WIRE_ARGS="--rate 1gbit" etc.): N = 2, 4, 8,
# 1, 4, 16, 64 MiB, 3 repetitions, two jobs of 4 sharing the links; benchmarks/results/wire_bench.csv
# and .png (~6 min on a quiet 2-core machine; QUICK=1: N = 2, 4 at 4 MiB, under a minute).
bench-wire: setup-emulation
	@$(call in_emulation,benchmarks/wire_bench.py $(if $(QUICK),--quick) $(WIRE_ARGS))

# The same 8-rank job on the leaf-spine tree (2 ToRs x 4) and on one switch, turn by turn, every
# link shaped (100 Mbit/s; TREE_ARGS="--sizes-mib 64" etc.): medians, tree / one switch, each ToR
# uplink's bytes per direction per call over the tensor's; benchmarks/results/tree_bench.csv and
# .png (4 and 16 MiB, 5 repetitions: ~2 min; QUICK=1: 4 MiB, one repetition).
bench-tree: setup-emulation
	@$(call in_emulation,benchmarks/tree_bench.py $(if $(QUICK),--quick) $(TREE_ARGS))

# DDP training on shaped links (100 Mbit/s; TRAIN_ARGS="--model transformer --rate 1gbit" etc.): gloo,
# inagg (switch), inagg + AR-Topk and PowerSGD trained side by side in the same ranks, 4 and 8 workers:
# step time, time to the target accuracy, final accuracy; benchmarks/results/train_bench.csv and .png
# (QUICK=1: 4 workers, 2 turns of 5 steps). TRAIN_ARGS="--bw-schedule 0:100,20:20,40:100": every link's
# rate changed at those seconds after time zero (Mbit/s), step times and ratios per phase as well;
# "--steps 600 --target 0.9 --until-target": a run to the target accuracy (at most 600 steps each).
bench-train: setup-emulation
	@$(call in_emulation,benchmarks/train_bench.py $(if $(QUICK),--quick) $(TRAIN_ARGS))

# The papers' figures, one target each (benchmarks/fig_*.py, benchmarks/figures.py): CSV, PNG and
# record (command, commit, load samples) in docs/results/<UTC date>-figs/, every point the median
# and min-max of several repetitions; refused when the 1-minute load is above MAX_LOAD (LOADED=mark:
# run and mark the figure "not quiet"). fig-workers: SwitchML's time vs workers (2, 4, 8) against
# gloo's ring on shaped links; fig-loss: its time vs loss (0-1 %) at the soft switch's ports;
# fig-tenants: ATP's JCT and Jain's index, dynamic vs static vs atp sharing of the slots; fig-tree: two
# levels vs one switch at equal windows. What each shows and takes: docs/results/README.md, "Figures".
fig_run = @if [ "$$(id -u)" = 0 ] && command -v mnexec >/dev/null; then \
	  FIG_MAKE="make $@ FIG_ARGS='$(FIG_ARGS)'" $(BIN)/python benchmarks/$(1).py --max-load $(MAX_LOAD) \
	  --loaded $(LOADED) $(FIG_ARGS); else echo "$@: needs root and Mininet (make setup-emulation)"; exit 2; fi
MAX_LOAD ?= 1.0
LOADED   ?= refuse

fig-workers: setup-emulation
	$(call fig_run,fig_workers)
fig-loss: setup-emulation
	$(call fig_run,fig_loss)
fig-tenants: setup-emulation
	$(call fig_run,fig_tenants)
fig-tree: setup-emulation
	$(call fig_run,fig_tree)

# Stops your runs (ALL=1: every user's) and deletes them and the builds; other users' runs stay.
clean:
	$(BIN)/python -m inagg.bmv2_env.emulation.mininet_run --clean $(if $(ALL),--all)
	find build -mindepth 1 -maxdepth 1 ! -name emulation -exec rm -rf {} + 2>/dev/null; \
	  rmdir build 2>/dev/null; true
	rm -rf logs pcaps benchmarks/results .pytest_cache .hypothesis

# Regenerate the job service's Python stubs. p4runtime-shell pins protobuf < 3.21, so the
# generator (grpcio-tools, which wants a newer protobuf) runs in a throwaway venv.
protos:
	$(PYTHON) -m venv build/protoc-venv
	build/protoc-venv/bin/pip install -q "grpcio-tools==1.59.3"
	cd hostlib/jobservice/proto && ../../../build/protoc-venv/bin/python -m grpc_tools.protoc -I. \
	  --python_out=. --grpc_python_out=. inagg_controller.proto
	sed -i 's/^import inagg_controller_pb2 as/from . import inagg_controller_pb2 as/' \
	  hostlib/jobservice/proto/inagg_controller_pb2_grpc.py

# Compile the P4 program and refresh the committed BMv2 JSON + P4Info in p4/out/bmv2/ (needs
# p4c), then the software target's P4Info in p4/out/soft/: the same program at its own K
# (tools/soft_p4info.py), measured best on loopback (README, Benchmarks); BMv2 keeps the
# program's 64. One folder per target under p4/out/ (as ONOS's p4c-out/<target>/).
# With P4_DEFINES (-D flags, e.g. P4_DEFINES="-DINAGG_SLOTS=64 -DSWITCH_VALUES_PER_PACKET=32"), the
# program is built for BMv2 into a folder of its own, build/p4/bmv2-<defines> (P4_DEFINES_BUILD),
# which keeps its flags in `defines`; the committed outputs stay as they are. `make run
# DATAPLANE=bmv2 P4_BUILD=<that folder>` runs it (the controller reads its sizes from its P4Info).
SOFT_VALUES_PER_PACKET ?= 4096
empty :=
space := $(empty) $(empty)
P4_DEFINES_BUILD ?= build/p4/bmv2-$(subst $(space),-,$(strip $(subst -D,,$(P4_DEFINES))))
build:
ifneq ($(strip $(P4_DEFINES)),)
	@for f in $(P4_DEFINES); do case "$$f" in -D?*) ;; *) \
	  echo "make build: P4_DEFINES takes -D flags (e.g. P4_DEFINES=\"-DINAGG_SLOTS=64\"), got '$$f'" >&2; \
	  exit 2;; esac; done
	mkdir -p $(P4_DEFINES_BUILD)
	$(P4C) --arch v1model $(P4_DEFINES) --p4runtime-files $(P4_DEFINES_BUILD)/inagg.p4info.txtpb \
	  -o $(P4_DEFINES_BUILD)/inagg.json p4/inagg.p4
	echo '$(P4_DEFINES)' > $(P4_DEFINES_BUILD)/defines
	@echo "built with $(P4_DEFINES) into $(P4_DEFINES_BUILD)/ (p4/out/ untouched); run it:" \
	  "make run DATAPLANE=bmv2 P4_BUILD=$(P4_DEFINES_BUILD)"
else
	mkdir -p $(P4_OUT)/bmv2 $(P4_OUT)/soft
	$(P4C) --arch v1model --p4runtime-files $(P4_OUT)/bmv2/inagg.p4info.txtpb \
	  -o $(P4_OUT)/bmv2/inagg.json p4/inagg.p4
	$(PYTHON) -m tools.soft_p4info --source $(P4_OUT)/bmv2/inagg.p4info.txtpb \
	  --values-per-packet $(SOFT_VALUES_PER_PACKET) --out $(P4_OUT)/soft/inagg.p4info.txtpb
endif

# P4Testgen's tests of the BMv2 program and of the Tofino program for each chip (bounded and
# seeded: tools/testgen.py) into p4/testgen/<target>/, with the command, the tool's hash and the
# sources' hash in manifest.json (needs p4testgen: ../shared/toolchains/install p4testgen;
# 5-8 minutes on 2 cores). tests/test_testgen_replay.py replays them on every engine.
TESTGEN_TARGETS ?= bmv2 tofino tofino2
testgen: setup
	$(BIN)/python -m tools.testgen $(foreach t,$(TESTGEN_TARGETS),--target $(t))

# Compile the Tofino program with bf-p4c for each chip in TOFINO_TARGETS (default both: tofino,
# TNA; tofino2, t2na, with this bf-p4c only without CLOTs: it fails on the split value stacks
# otherwise) into build/<target>/,
# then refresh the committed artifacts in p4/out/<target>/: P4Info, <target>.bin, context.json and
# bfrt.json (gzipped: 170 KB instead of 5 MB), the compiler's resource summary
# (docs/tofino.md), its parsers (tools/tofino_parser.py: what the TNA model walks) and what they
# were built from (tools/built_from.py: the test's proof of currency without a recompile). bf-p4c
# empties its -o folder first, so its log goes to build/<target>.compile.log (then a copy in
# build/<target>/compile.log). Standard P4Runtime counters/registers, so bf_switchd's P4Runtime server and
# our software switch read the same P4Info.
TOFINO_TARGETS ?= tofino tofino2
# what built_from.json hashes: the files the Tofino program reads (tools/built_from.py TOFINO_SOURCES)
TOFINO_SOURCES := 'p4/tofino/*.p4' p4/include/headers.p4 p4/include/constants.p4 p4/include/size.p4 \
	p4/include/unroll.p4
tofino: setup
	@for t in $(TOFINO_TARGETS); do \
	  arch=$$( [ $$t = tofino2 ] && echo t2na || echo tna ); \
	  extra=$$( [ $$t = tofino2 ] && echo -Xp4c=--no-clot ); \
	  rm -rf build/$$t && mkdir -p build/$$t $(P4_OUT)/$$t && \
	  $(BF_P4C) --target $$t --arch $$arch $$extra --p4runtime-force-std-externs --verbose 1 \
	    --p4runtime-files build/$$t/inagg.p4info.txtpb -o build/$$t p4/tofino/inagg.p4 \
	    2> build/$$t.compile.log || { tail -20 build/$$t.compile.log; exit 1; }; \
	  cp build/$$t.compile.log build/$$t/compile.log && \
	  cp build/$$t/inagg.p4info.txtpb $(P4_OUT)/$$t/ && \
	  for f in bfrt.json pipe/$$t.bin pipe/context.json; do \
	    gzip -9 -n -c build/$$t/$$f > $(P4_OUT)/$$t/$$(basename $$f).gz; done && \
	  $(BIN)/python -m tools.tofino_resources build/$$t > $(P4_OUT)/$$t/resources.json && \
	  $(BIN)/python -m tools.tofino_parser build/$$t > $(P4_OUT)/$$t/parser.json && \
	  $(BIN)/python -m tools.built_from $(P4_OUT)/$$t --compiler "$$($(BF_P4C) --version)" \
	    --flags "--target $$t --arch $$arch $$extra --p4runtime-force-std-externs" \
	    --sources $(TOFINO_SOURCES) || exit 1; \
	done
