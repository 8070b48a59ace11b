#!/usr/bin/env bash
# Remake tests/fixtures/megatron_bridge_checkpoint (a checkpoint Megatron-Bridge's own import and save wrote) in a
# Python 3.12 environment of its own: Megatron-Bridge 0.6.2 and megatron-core 0.19.2 from the pinned wheels
# (tests/fetch_megatron_bridge.sh), on torch 2.13.0 from PyPI (for Python 3.12, its CUDA build: a few GB, run on a
# CPU). Run by hand, once; CI and the tests never need it. PYTHON312 names the interpreter (default python3.12),
# VENV where the environment goes (default a temporary folder, removed at the end).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python312="${PYTHON312:-python3.12}"
venv="${VENV:-$(mktemp -d)/bridge312}"
wheels="${RLSTEPS_HOME:-$HOME/.cache/rlsteps}/upstream/megatron-bridge-0.6.2"
bash "$repo/tests/fetch_megatron_bridge.sh"
"$python312" -m venv "$venv"
pip=("$venv/bin/pip" install -q)
"${pip[@]}" torch==2.13.0
"${pip[@]}" "$wheels"/megatron_core-0.19.2-*.whl numpy==2.4.6 transformers==5.12.1 tokenizers==0.22.2 \
    safetensors==0.8.0 omegaconf==2.3.1 hydra-core==1.3.8 datasets==5.2.0 accelerate==1.15.0 pillow==13.0.0 \
    einops==0.8.2 pyyaml==6.0.4 tqdm==4.70.1 rich==15.0.0 regex==2026.11.19 six==1.17.0 typing-extensions==4.16.0
# Bridge's own requirements include GPU-only packages (Transformer Engine, flashinfer); the fixture's script gives
# the imports it needs of them the stand-ins of tests/megatron_bridge_oracle.py.
"${pip[@]}" --no-deps "$wheels"/megatron_bridge-0.6.2-py3-none-any.whl
"$venv/bin/python" "$repo/tests/make_bridge_checkpoint.py"
if [ -z "${VENV:-}" ]; then rm -rf "$(dirname "$venv")"; fi
