#!/usr/bin/env bash
# Megatron-Bridge 0.6.2 and the megatron-core 0.19.2 it runs on (its megatron.training config and checkpoint code),
# downloaded once as wheels, without dependencies, into $RLSTEPS_HOME/upstream/megatron-bridge-0.6.2 for the tests
# that judge checkpoint_megatron with Bridge's own loaders (tests/megatron_bridge.py unpacks them). Both are
# Python 3.12 wheels; their code is imported, not installed. PYTHON picks the interpreter whose pip downloads.
set -euo pipefail
target="${RLSTEPS_HOME:-$HOME/.cache/rlsteps}/upstream/megatron-bridge-0.6.2"
if [ -f "$target/.complete" ]; then exit 0; fi
staging="$target.partial-$$"
rm -rf "$staging" && mkdir -p "$staging"
cat > "$staging/requirements.txt" <<'REQS'
megatron-bridge==0.6.2 --hash=sha256:bcb7274ab9327167c345aa24b96b95790ce5090df1945d883bdc41065d5649e2
megatron-core==0.19.2 --hash=sha256:8e3e486f13f559450415b9b9dc0ff3331a0bb83dd154553f7f350a75ff9c42b5
REQS
"${PYTHON:-python3}" -m pip download -q --no-deps --require-hashes --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform any -d "$staging" -r "$staging/requirements.txt"
touch "$staging/.complete"
rm -rf "$target" && mv "$staging" "$target"
