#!/usr/bin/env bash
# What the tests that judge rlsteps by its counterparts' own code need beside the venv, fetched once from the package
# index (never at test time): Megatron-Bridge's wheels (tests/fetch_megatron_bridge.sh), the few packages NeMo-Gym's
# models import (tests/upstream.py gym_deps) and the transformers, hydra and torchdata NeMo-RL's own code runs on
# (nemo_rl_deps). NeMo-RL's and NeMo-Gym's sources come from ../shared/upstream.
# And it starts building the seed-0 tiny world most tests start from (under $RLSTEPS_HOME, where the tests' tiny_world
# fixture finds it), in the background: beside these fetches, ruff and the tests' start; the fixture waits on the
# build's lock, and builds it itself if this build failed. Else the first test to need it builds it while the other
# test worker waits on that lock.
set -euo pipefail
cd "$(dirname "$0")/.."
nohup python -c "from rlsteps.tiny.build import ensure_tiny_world; ensure_tiny_world(seed=0)" > /dev/null 2>&1 &
bash tests/fetch_megatron_bridge.sh
python - <<'PY'
import sys

sys.path.insert(0, "tests")
import upstream

print("NeMo-Gym's model packages:", upstream.gym_deps())
print("NeMo-RL's run packages:", upstream.nemo_rl_deps())
PY
