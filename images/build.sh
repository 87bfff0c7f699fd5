#!/usr/bin/env bash
# Build the sandcell sandbox image with no image registry and no network inside the build.
#   images/build.sh                      base from debootstrap (made once, cached as an image)
#   BASE=python:3.12-slim images/build.sh  base from a registry, for users who have one
#   images/build.sh --hash               print the hash of the inputs and exit (no Docker needed)
# Python wheels are downloaded on the host and installed with --no-index. A second run with
# nothing changed only compares a hash with the image's label and exits.
set -euo pipefail
cd "$(dirname "$0")"

IMAGE=${SANDCELL_IMAGE:-sandcell-sandbox:latest}
DEFAULT_BASE=sandcell-base:bookworm
BASE=${BASE:-$DEFAULT_BASE}
PYTHON=${PYTHON:-}

# The host-container contract lives in sandbox/; the image gets a copy next to its programs.
cp ../sandbox/boundary.py boundary.py
SOURCES=(Dockerfile .dockerignore requirements.txt build.sh boundary.py supervisor.py sandcell_kernel.py relay.py files.py)
hash=$( (cat "${SOURCES[@]}"; echo "$BASE") | sha256sum | cut -c1-16)
if [ "${1:-}" = "--hash" ]; then
    echo "$hash"
    exit 0
fi
if [ "$(docker image inspect -f '{{ index .Config.Labels "sandcell.hash" }}' "$IMAGE" 2>/dev/null)" = "$hash" ]; then
    echo "image $IMAGE is up to date ($hash)"
    exit 0
fi

if [ "$BASE" = "$DEFAULT_BASE" ] && ! docker image inspect "$BASE" >/dev/null 2>&1; then
    echo "making base image $BASE with debootstrap (about a minute)..."
    command -v debootstrap >/dev/null || {
        [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || {
            echo "debootstrap is missing: install it, or build from a registry base: make image BASE=python:3.11-slim" >&2
            exit 1; }
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    root=$(mktemp -d /tmp/sandcell-rootfs.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,fonts-dejavu-core \
        bookworm "$root" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | docker import -c 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    rm -rf "$root" "$root.log"
fi

# The wheels must match the base's Python; ask the base when it is not the default.
if [ -z "$PYTHON" ]; then
    PYTHON=$(docker run --rm --network none --entrypoint python3 "$BASE" \
             -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
fi
stamp="$(sha256sum requirements.txt | cut -c1-16)-py$PYTHON"
if [ "$(cat .wheels/.stamp 2>/dev/null)" != "$stamp" ]; then
    echo "downloading wheels for Python $PYTHON..."
    rm -rf .wheels && mkdir -p .wheels
    python3 -m pip download -q --no-color --disable-pip-version-check --only-binary=:all: --no-deps \
        --python-version "$PYTHON" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 \
        -d .wheels -r requirements.txt 2>&1 | { grep -v "^WARNING: Location" || true; }
    cp requirements.txt .wheels/
    echo "$stamp" > .wheels/.stamp
fi

echo "building $IMAGE from $BASE..."
docker build -q --build-arg "BASE=$BASE" --label "sandcell.hash=$hash" \
    -t "$IMAGE" . >/dev/null
docker image inspect -f "built $IMAGE: {{ .Size }} bytes" "$IMAGE"
