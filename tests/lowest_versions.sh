#!/usr/bin/env bash
# The fast tests against the lowest versions pyproject.toml allows for rlsteps's direct dependencies (the core and
# the engine, megatron and lepton extras; their own dependencies at the newest that fit): uv's
# `--resolution lowest-direct`, in .venv-lowest, rebuilt each time. CI runs it beside README's test command.
#
# torch is the exception: only torch==2.13.0 (the CPU build, from pip's configured sources) is installed here, so
# its lower bound in pyproject.toml is what the code needs, read from the APIs it uses, not a run (docs/development.md).
# The switches that make a missing counterpart a failure (RLSTEPS_REQUIRE_*) are the main suite's: off here. The tiny
# world is built with these versions, in a home of its own, its reward model trained 20 steps instead of the recipe's
# 900 (every library call of the build made, at a tenth of its 3 minutes of one core): the tests of what the reward
# model learned (marked learned_reward_model) are the main suite's. It runs the fast tests of the files that drive the
# bounded packages' own APIs (API_TESTS below), not the whole fast tier: the rest reach them only through these, and the
# whole tier on one worker took about 8 minutes of CI's two cores beside the main suite.
#   bash tests/lowest_versions.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD venv=$PWD/.venv-lowest
for name in $(env | grep -o '^RLSTEPS_REQUIRE_[A-Z]*'); do unset "$name"; done
export RLSTEPS_HOME="$repo/.rlsteps-home-lowest" RLSTEPS_TEST_REWARD_MODEL_STEPS=20  # tests/conftest.py
# A copy of the tracked files, built and tested there: CI's main install builds rlsteps in this tree at the same
# time, and two builds must not share its egg-info, build/ or bytecode. The copy goes at the end (and with it this
# environment's editable rlsteps: it is rebuilt on every call).
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$copy"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --no-deps torch==2.13.0
"$venv/bin/pip" install -q uv==0.13.9
test_tools=$(grep -i '^\(pytest\|pytest-xdist\|pytest-timeout\|jsonschema\)==' constraints.txt)
mapfile -t test_tools <<< "$test_tools"
cd "$copy"
"$venv/bin/uv" pip install -q --python "$venv/bin/python" --resolution lowest-direct \
    -e '.[engine,megatron,lepton]' "${test_tools[@]}"
"$venv/bin/uv" pip freeze --python "$venv/bin/python" \
    | grep -i '^\(typer\|omegaconf\|pydantic\|fsspec\|rich\|httpx\|torch\|transformers\|tokenizers\|safetensors\|numpy\|fastapi\|uvicorn\|matplotlib\|megatron-core\|psutil\|leptonai\)=='
API_TESTS=(
    test_cli.py test_output_width.py                               # typer, click, rich
    test_compile.py test_profiles.py test_catalog.py               # omegaconf, pydantic
    test_generation.py test_policy.py test_logprobs.py             # transformers' models, caches and generation
    test_tiny.py test_prompt_tokenizer.py                          # tokenizers, safetensors, the tiny world's build
    test_megatron_format.py                                        # megatron-core, torch's distributed checkpoint
    test_reward_server.py test_reward_client.py test_judge_server.py  # fastapi, uvicorn, httpx
    test_launch_lepton.py                                          # leptonai
    test_run_end_costs.py                                          # matplotlib's plot
)
# CI builds the pinned versions' tiny world (tests/prepare_oracles.sh) while this one installs, and the main suite's
# first tests wait for it: where RLSTEPS_LOWEST_AFTER names that world's world.json, the tests here (whose first tiny
# test builds a world of its own) start once it is there, or after 30 minutes, so the two builds do not share the
# two cores while both workers wait
if [[ -n "${RLSTEPS_LOWEST_AFTER:-}" ]]; then
    for _ in $(seq 360); do [[ -e "$RLSTEPS_LOWEST_AFTER" ]] && break; sleep 5; done
fi
"$venv/bin/python" -m pytest -m "not slow and not learned_reward_model" -p no:cacheprovider "${API_TESTS[@]/#/tests/}" "$@"
