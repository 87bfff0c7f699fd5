#!/usr/bin/env bash
# Make sure Podman's Docker-compatible API answers on $PODMAN_SOCK (/run/podman/podman.sock)
# and holds the sandbox image Docker has, for the tests that run sandcell against Podman
# (DOCKER_HOST=unix://$PODMAN_SOCK). As root on Debian it installs `podman` (Debian's 4.3),
# starts `podman system service` in the background (log: /var/log/sandcell-podman.log) and
# copies the image over (`docker save | podman load`, about 30 s, only when it differs);
# elsewhere it says why it skipped, and the Podman tests then skip too (or fail, with CI=true).
set -euo pipefail
# shellcheck source=scripts/daemon.sh
. "$(dirname "$0")/daemon.sh"

SOCK="${PODMAN_SOCK:-/run/podman/podman.sock}"
LOG=/var/log/sandcell-podman.log
IMAGE="${SANDCELL_IMAGE:-sandcell-sandbox:latest}"
BASE=sandcell-base:bookworm

answers() {  # the service answers its ping
    python3 - "$SOCK" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
s.connect(sys.argv[1])
s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
sys.exit(0 if b" 200 " in s.recv(200) else 1)
PY
}

if ! command -v podman >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
        echo "sandcell: podman is not installed and this is not root on Debian: skipping it" \
            "(the Podman tests skip; install podman and run \`podman system service\`)" >&2
        exit 0
    fi
    echo "sandcell: installing podman (apt-get)..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null
fi

if ! answers; then
    mkdir -p "$(dirname "$SOCK")"
    rm -f "$SOCK"  # a stale socket of a service that died
    # --time=0: never ends when idle; from / (start_daemon): its conmon cannot start a
    # container once its working directory is gone
    start_daemon "$LOG" podman system service --time=0 "unix://$SOCK"
    for _ in $(seq 100); do
        answers && break
        sleep 0.1
    done
    answers || { echo "sandcell: podman's service did not answer; its log:" >&2; tail -20 "$LOG" >&2; exit 1; }
    echo "sandcell: podman's Docker API is up on $SOCK" >&2
fi

# The images Docker has, copied when Podman's differ (an image's id is its config's digest)
for name in "$BASE" "$IMAGE"; do
    want=$(docker image inspect -f '{{.Id}}' "$name" 2>/dev/null | sed 's/^sha256://') || continue
    have=$(podman image inspect -f '{{.Id}}' "$name" 2>/dev/null || true)
    if [ "$want" != "$have" ]; then
        echo "sandcell: copying $name into podman..." >&2
        docker save "$name" | podman load -q >/dev/null
    fi
done
