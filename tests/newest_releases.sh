#!/usr/bin/env bash
# The fast tests against the newest releases of every dependency (no constraints file): what a fresh
# `pip install rlsteps[...]` gets today. In .venv-newest, rebuilt each time; the vLLM and oracle tiers are left out.
#   bash tests/newest_releases.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .venv-newest
python3 -m venv .venv-newest
.venv-newest/bin/pip install -q torch==2.13.0
.venv-newest/bin/pip install -q -U -e '.[engine,megatron,lepton,test]'
.venv-newest/bin/pip freeze | grep -i '^transformers==\|^pydantic==\|^omegaconf==\|^typer==\|^megatron-core=='
.venv-newest/bin/python -m pytest -m "not slow" "$@"
