#!/usr/bin/env bash
# Rewrite constraints.txt, constraints-vllm.txt and constraints-triton.txt from the environments README's test command
# built (.venv, .venv-vllm and .venv-triton): the exact versions CI installs, so a release made after them changes
# nothing until this is rerun and the tests pass with it. torch is left out (installed first, by its exact version); rlsteps itself too.
set -euo pipefail
cd "$(dirname "$0")/.."
freeze() {
    echo "# pip constraints: the exact set CI installs beside $2 (bash tests/freeze_constraints.sh rewrites it)"
    "$1/bin/pip" freeze 2>/dev/null | grep -v '^-e \|^torch==\| @ \|^#' | LC_ALL=C sort -f
}
freeze .venv "README's test command" > constraints.txt
freeze .venv-vllm "the vLLM environment (tests/make_vllm_env.sh)" > constraints-vllm.txt
freeze .venv-triton "PyTriton's environment (tests/make_triton_env.sh)" > constraints-triton.txt
