#!/usr/bin/env bash
# Make sure Debian's chromium is there for the page's browser tests (tests/test_serve_page.py
# drives it with Playwright; no browser is ever downloaded). Does nothing when it is installed;
# as root on Debian it installs the `chromium` package; elsewhere it says why it skipped, and
# the browser tests then skip too (or fail, with CI=true).
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    exit 0
fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "sandcell: chromium not installed and not root on Debian: skipping it" \
        "(the browser tests skip; install Debian's chromium package to run them)" >&2
    exit 0
fi

echo "sandcell: installing chromium (apt-get)..." >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
