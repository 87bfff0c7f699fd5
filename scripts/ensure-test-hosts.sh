#!/usr/bin/env bash
# The --allow-net tests' host names (tests/test_net_sandbox.py): lines in this machine's hosts
# file, written once here, before the suite (parallel workers never edit it). `.test` is
# reserved for testing (RFC 6761): no real host has these names. Does nothing when they are
# there; as root it appends them; elsewhere it says why it skipped, and those tests then skip
# too (or fail, with CI=true).
set -euo pipefail

HOSTS=/etc/hosts
LINES=(
    "127.0.0.1 files.sandcell.test other.sandcell.test"  # the loopback servers: internal: form
    "10.255.255.1 private.sandcell.test"  # a private address nobody serves: refused as a plain name
)

missing=()
for line in "${LINES[@]}"; do
    grep -qxF "$line" "$HOSTS" || missing+=("$line")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "sandcell: the test host names are not in $HOSTS and this is not root: skipping them" \
        "(the --allow-net name tests skip; run scripts/ensure-test-hosts.sh as root)" >&2
    exit 0
fi
printf '%s\n' "${missing[@]}" >> "$HOSTS"
