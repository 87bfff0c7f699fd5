#!/usr/bin/env bash
# Build the sandcell sandbox image with no image registry and no network inside the build.
#   images/build.sh                      base from debootstrap (made once, cached as an image)
#   BASE=python:3.12-slim images/build.sh  base from a registry, for users who have one
#   EXTRA=more.txt images/build.sh       also install the packages more.txt requires
#   images/build.sh --hash               print the hash of the inputs and exit (no Docker needed)
#   images/build.sh --repin              re-resolve requirements.in into requirements.txt,
#                                        keeping today's pins (delete a line to upgrade it)
# Python wheels are downloaded on the host and installed with --no-index. A second run with
# nothing changed only compares a hash with the image's label and exits.
set -euo pipefail
EXTRA=${EXTRA:-}
if [ -n "$EXTRA" ]; then  # named from where make ran, before the cd
    [ -f "$EXTRA" ] || { echo "EXTRA=$EXTRA: no such requirements file" >&2; exit 1; }
    EXTRA=$(realpath "$EXTRA")
fi
cd "$(dirname "$0")"

IMAGE=${SANDCELL_IMAGE:-sandcell-sandbox:latest}
DEFAULT_BASE=sandcell-base:bookworm
BASE=${BASE:-$DEFAULT_BASE}
PYTHON=${PYTHON:-}

# The host-container contract lives in sandbox/; the image gets a copy next to its programs.
cp ../sandbox/boundary.py boundary.py
SOURCES=(Dockerfile .dockerignore requirements.txt build.sh boundary.py supervisor.py sandcell_kernel.py relay.py files.py checks.py)
hash=$( (cat "${SOURCES[@]}"; echo "$BASE"; if [ -n "$EXTRA" ]; then cat "$EXTRA"; fi) \
       | sha256sum | cut -c1-16)
if [ "${1:-}" = "--hash" ]; then
    echo "$hash"
    exit 0
fi

# pip download for the image's platform; the arguments say what
download() {
    python3 -m pip download -q --no-color --disable-pip-version-check --only-binary=:all: \
        --python-version "$PYTHON" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 \
        "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }
}

if [ "${1:-}" = "--repin" ]; then
    PYTHON=${PYTHON:-3.11}
    pins=$(mktemp -d)
    trap 'rm -rf "$pins"' EXIT
    download -d "$pins" --find-links .wheels -r requirements.in -c requirements.txt
    { echo "# Pinned closure of requirements.in for Python $PYTHON (the debootstrap base). Regenerate: images/build.sh --repin"
      ls "$pins" | sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/' | sort -f; } > requirements.txt.new
    mv requirements.txt.new requirements.txt
    echo "requirements.txt: $(grep -vc '^#' requirements.txt) pins"
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
    download --no-deps -d .wheels -r requirements.txt
    cp requirements.txt .wheels/
    echo "$stamp" > .wheels/.stamp
fi
# The extra requirements and what they need, kept to today's pins, in a folder of their own
# so that changing them never downloads the pinned closure again.
extra_stamp="$(if [ -n "$EXTRA" ]; then sha256sum "$EXTRA" | cut -c1-16; fi)-$stamp"
if [ "$(cat .wheels/extra/.stamp 2>/dev/null)" != "$extra_stamp" ]; then
    rm -rf .wheels/extra && mkdir -p .wheels/extra
    if [ -n "$EXTRA" ]; then
        echo "downloading the wheels $EXTRA needs..."
        cp "$EXTRA" .wheels/extra/requirements.txt
        download -d .wheels/extra --find-links .wheels -r .wheels/extra/requirements.txt \
            -c requirements.txt
    fi
    touch .wheels/extra/requirements.txt
    echo "$extra_stamp" > .wheels/extra/.stamp
fi

echo "building $IMAGE from $BASE..."
docker build -q --build-arg "BASE=$BASE" --label "sandcell.hash=$hash" \
    -t "$IMAGE" . >/dev/null
docker image inspect -f "built $IMAGE: {{ .Size }} bytes" "$IMAGE"
