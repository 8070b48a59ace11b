#!/usr/bin/env bash
# The GPU paths CI never runs, in one command (benchmarks/gpu_check.py has the rows; --help lists the flags).
#   bash benchmarks/gpu_check.sh [--only TEXT ...] [--cpu-smoke] [--no-targets] [--work DIR]
# Runs with $PYTHON, else the repository's .venv, else python3 on the PATH; exits non-zero on any failed row.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
exec "$python" benchmarks/gpu_check.py "$@"
