#!/usr/bin/env bash
# Make sure a Docker engine answers. Does nothing when `docker info` already works;
# as root on Debian it installs docker.io and starts dockerd; elsewhere it says what to do.
set -euo pipefail

if docker info >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    cat >&2 <<'MSG'
sandcell: no Docker engine answers `docker info`.
  - Linux: install Docker (https://docs.docker.com/engine/install/) and start it
    (`sudo systemctl start docker`), and make sure your user may use it
    (`sudo usermod -aG docker $USER`, then log in again).
  - macOS/Windows: start Docker Desktop (see README, "macOS").
  - As root on Debian/Ubuntu this step installs docker.io and starts dockerd by itself.
MSG
    exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
    echo "sandcell: installing docker.io (apt-get)..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
    echo "sandcell: starting dockerd (log: /var/log/sandcell-dockerd.log)..." >&2
    nohup dockerd >/var/log/sandcell-dockerd.log 2>&1 &
fi

for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        echo "sandcell: Docker engine is up." >&2
        exit 0
    fi
    sleep 1
done
echo "sandcell: dockerd did not answer within 60 s; see /var/log/sandcell-dockerd.log" >&2
exit 1
