#!/usr/bin/env bash
# What the tests that judge rlsteps by its counterparts' own code need beside the venv, fetched once from the package
# index (never at test time): Megatron-Bridge's wheels (tests/fetch_megatron_bridge.sh), the few packages NeMo-Gym's
# models import (tests/upstream.py gym_deps) and the transformers, hydra and torchdata NeMo-RL's own code runs on
# (nemo_rl_deps). NeMo-RL's and NeMo-Gym's sources come from ../shared/upstream.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/fetch_megatron_bridge.sh
python - <<'PY'
import sys

sys.path.insert(0, "tests")
import upstream

print("NeMo-Gym's model packages:", upstream.gym_deps())
print("NeMo-RL's run packages:", upstream.nemo_rl_deps())
PY
