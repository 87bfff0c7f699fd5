#!/usr/bin/env bash
# Make sure Debian's prometheus is there for the metrics tests (tests/test_metrics_serve.py
# starts it, scraping a real `sandcell serve` on loopback; no binary is ever downloaded). Does
# nothing when it is installed; as root on Debian it installs the `prometheus` package without
# its recommends (no node exporter); elsewhere it says why it skipped, and those tests then
# skip too (or fail, with CI=true). The package's own service is left stopped: each test starts
# its own server on a free port with its own storage.
set -euo pipefail

if [ -x /usr/bin/prometheus ]; then
    exit 0
fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "sandcell: prometheus not installed and not root on Debian: skipping it" \
        "(the metrics tests skip; install Debian's prometheus package to run them)" >&2
    exit 0
fi

echo "sandcell: installing prometheus (apt-get)..." >&2
apt-get update -qq
# a policy that forbids starting services: the package's own prometheus stays down (an
# operator's own policy, where there is one, is left as it is)
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
