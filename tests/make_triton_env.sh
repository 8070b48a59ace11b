#!/usr/bin/env bash
# NeMo-Aligner's reward server's counterpart for the tests in a virtual environment of its own, .venv-triton: PyTriton
# (nvidia-pytriton, which bundles Triton's server and needs numpy<2, where rlsteps' environment has numpy 2), torch's
# CPU build and transformers, on which tests/triton_reward_server.py serves the tiny reward model under
# NeMo-Aligner's names. Idempotent: an environment that already imports them is kept. Calls take turns on a lock.
#
#   bash tests/make_triton_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-triton
exec 9> .venv-triton.lock
flock 9
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import pytriton.triton, transformers, torch" 2>/dev/null; then
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q -c constraints-triton.txt nvidia-pytriton 'numpy<2' transformers
