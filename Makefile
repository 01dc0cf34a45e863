# TrainingCXL device: every flow goes through this file.
#   make sim      the main job: train a DLRM through the device, crash, recover, report
#   make test     the regression (pytest -n auto: Verilator, and a sample on Icarus; SIM=icarus: every group on Icarus)
#   make test-fast  the Amaranth-simulator tests only (the edit-test loop, minutes)
#   make verilog  elaborate every design for CONFIG into build/verilog/<config>/, with a
#                 FuseSoC core and a file list (docs/fpga.md)
#   make lint     Verilator -Wall on every generated module, ruff on the Python
#   make ruff     ruff on the Python only (seconds; CI runs it before the tests)
#   make bench    benchmarks, JSON under build/bench/
#   make sweep    speedup over the baselines across platform and workload (build/bench/sweep*)
#   make fuzz     the fuzzers: 10,000 descriptors, 100,000 CXL.mem and 100,000 CXL.cache messages (build/bench/robustness.json)
#   make campaign N=<points>  the crash campaign in parallel chunks (build/campaign/summary.json)
#   make coverage line and toggle coverage per block of the Verilator regression (build/coverage/)
#   make synth    UltraScale+ resources + memory-inference check (ECP5=1: nextpnr-ecp5 Fmax)
#   make formal   bounded proofs of the bus rules (yosys-smtbmc), JSON under build/formal/
# Variables: SIM=verilator|icarus  CONFIG=<preset name or .toml path>  WAVES=1  SEED=<n>
#            CRASH_AT=<cycles>|-1 (make sim: when the power fails; -1: never)
#            PLATFORM=<name>[:<field>=<value>,...] (make sim, and make bench's system
#            benchmark: docs/platform.md)

SIM    ?= verilator
CONFIG ?= default
WAVES  ?= 0
PYTHON ?= python3

VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# make test runs both simulators unless SIM is given on the command line or in the environment.
TEST_SIM := $(if $(filter command line environment,$(origin SIM)),$(SIM))
# make lint checks every preset unless CONFIG is given.
LINT_CONFIGS := $(if $(filter command line environment,$(origin CONFIG)),--config $(CONFIG))

.PHONY: all venv verilog sim test test-fast lint ruff bench sweep fuzz campaign coverage synth formal clean check-icarus check-sim help
all: help

help:
	@sed -n '2,/^$$/p' Makefile

# First use: create .venv and install the pinned dependencies from pyproject.toml.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || \
	  { echo "error: Python 3.11 is required as '$(PYTHON)' (set PYTHON=/path/to/python3.11)"; exit 1; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || \
	  { echo "error: Python's venv module is missing: sudo apt-get install -y python3-venv"; exit 1; }
	@echo "Creating $(VENV) and installing pinned dependencies (first use only)..."
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q ".[dev]"
	@touch $@

venv: $(STAMP)

check-icarus:
	@command -v iverilog >/dev/null && command -v vvp >/dev/null || \
	  { echo "error: Icarus Verilog not found; install it with: sudo apt-get install -y iverilog"; exit 1; }

check-sim: $(STAMP)
	@if [ "$(SIM)" = icarus ]; then $(MAKE) -s check-icarus; fi

verilog: $(STAMP)
	$(PY) -m hw.gen --config $(CONFIG) --out build/verilog
	$(PY) -m hw.csr.docgen --config $(CONFIG) --out build/verilog
	$(PY) -m hw.core --config $(CONFIG) --out build/verilog

sim: $(STAMP) check-sim
	$(PY) -m sim.train --config $(CONFIG) --sim $(SIM) $(if $(filter 1,$(WAVES)),--waves) $(if $(SEED),--seed $(SEED)) $(if $(CRASH_AT),--crash-at $(CRASH_AT)) $(if $(PLATFORM),--platform $(PLATFORM))

# Icarus is the second simulator; without it the Icarus half of the suite is skipped
# with a message rather than failing obscurely.
test: $(STAMP)
	@command -v iverilog >/dev/null || \
	  echo "warning: Icarus Verilog not found (sudo apt-get install -y iverilog); its tests will be skipped"
	$(if $(TEST_SIM),SIM=$(TEST_SIM)) $(PY) -m pytest -n auto --maxschedchunk 1 --durations=25

# The edit-test loop: each Amaranth-simulator test once, with its first parameter set;
# no simulator build, no Verilator lint, no long run (tests/conftest.py, --fast).
test-fast: $(STAMP)
	$(PY) -m pytest -n auto --fast

lint: $(STAMP) ruff
	$(PY) -m sim.lint $(LINT_CONFIGS)

ruff: $(STAMP)
	$(VENV)/bin/ruff check hw sim tb tests

bench: $(STAMP) check-sim
	$(PY) -m sim.bench --config $(CONFIG) --sim $(SIM) $(if $(SEED),--seed $(SEED)) $(if $(PLATFORM),--platform $(PLATFORM))

# TrainingCXL's speedup over its baselines across platform and workload (sim/sweep.py):
# 31 RTL points; build/bench/sweep.json and PNG heatmaps. About 20 minutes on 2 cores.
sweep: $(STAMP) check-sim
	$(PY) -m sim.sweep --config $(CONFIG) --sim $(SIM) $(if $(SEED),--seed $(SEED))

# The fuzzers (sim/fuzz.py): DESCRIPTORS random descriptors, MESSAGES random CXL.mem
# messages and CACHE_MESSAGES fuzzed CXL.cache (H2D) messages, one simulator run each
# (0 skips one); figures into build/bench/robustness.json.
# CONFIG defaults to small here. About 30 minutes on 2 cores.
DESCRIPTORS    ?= 10000
MESSAGES       ?= 100000
CACHE_MESSAGES ?= 100000

fuzz: $(STAMP) check-sim
	$(PY) -m sim.fuzz --descriptors $(DESCRIPTORS) --messages $(MESSAGES) --cache-messages $(CACHE_MESSAGES) --sim $(SIM) $(if $(filter command line environment,$(origin CONFIG)),--config $(CONFIG)) $(if $(SEED),--seed $(SEED))

# The crash campaign at scale (sim/campaign.py): N crash points in chunks of CHUNK, one
# simulator run each, on all local cores (JOBS) or a Dask cluster (DASK=<address>|local;
# Dask comes with the dev extra); build/campaign/summary.json. CONFIG defaults to small here.
N     ?= 200
CHUNK ?= 50

campaign: $(STAMP) check-sim
	$(PY) -m sim.campaign --points $(N) --chunk $(CHUNK) --sim $(SIM) $(if $(filter command line environment,$(origin CONFIG)),--config $(CONFIG)) $(if $(SEED),--seed $(SEED)) $(if $(JOBS),--jobs $(JOBS)) $(if $(DASK),--dask $(DASK))

# Line and toggle coverage per block (sim/coverage.py): the Verilator regression of
# CONFIG (small here) on a coverage build; build/coverage/<config>/summary.json.
coverage: $(STAMP) check-sim
	$(PY) -m sim.coverage $(if $(filter command line environment,$(origin CONFIG)),--config $(CONFIG)) $(if $(JOBS),--jobs $(JOBS))

# UltraScale+ (synth_xilinx -family xcup) resources and the on-chip memory check (fails when
# a memory of more than 512 bits is left in flip-flops), build/synth/<config>/summary.json;
# ECP5=1 adds the ECP5-85F Fmax flow (nextpnr, out of context); YOSYS=native runs a yosys
# on PATH (Debian's package) instead of the YoWASP build. Installs the YoWASP tools on
# first use.
SYNTH_STAMP := $(VENV)/.installed-synth
$(SYNTH_STAMP): $(STAMP)
	$(VENV)/bin/pip install -q ".[synth]"
	@touch $@

synth: $(SYNTH_STAMP)
	$(PY) -m sim.synth --config $(CONFIG) $(if $(filter 1,$(ECP5)),--ecp5) $(if $(YOSYS),--yosys $(YOSYS))

# Bounded proofs of the bus rules (sim/formal, docs/verification.md); installs Yosys
# (YoWASP) and the Yices solver on first use. About 2.5 minutes on 2 cores.
FORMAL_STAMP := $(VENV)/.installed-formal
$(FORMAL_STAMP): $(STAMP)
	$(VENV)/bin/pip install -q ".[formal]"
	@touch $@

formal: $(FORMAL_STAMP)
	$(PY) -m sim.formal --mutations

clean:
	rm -rf build
