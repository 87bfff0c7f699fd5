#!/usr/bin/env bash
# Make sure a Docker engine answers, and with RUNTIME=runsc that it knows gVisor's runtime.
# Does nothing when all is there already; as root on Debian it installs docker.io (and runsc),
# registers the runtime in /etc/docker/daemon.json and starts dockerd, or reloads a running
# one with SIGHUP (never a restart: other containers keep running); elsewhere it says what
# to do.
set -euo pipefail
# shellcheck source=scripts/daemon.sh
. "$(dirname "$0")/daemon.sh"

RUNTIME="${RUNTIME:-}"
DAEMON_JSON=/etc/docker/daemon.json
# --network=none: runsc refuses a container without its own network namespace otherwise.
# --host-uds=all: the kernel's relay binds its ipc sockets in the bind-mounted connection
# folder (`create`), and after a kernel restart the new relay must unlink the old socket
# files there, which gVisor allows only with `open` too. No other host socket is reachable:
# the only other bind mounts are the read-only input files.
RUNSC_ARGS='["--network=none", "--host-uds=all"]'

case "$RUNTIME" in
    "" | runc) RUNTIME="" ;;
    runsc) ;;
    *) echo "sandcell: RUNTIME=$RUNTIME is not one this step installs (runsc, or none)" >&2; exit 2 ;;
esac

known() {  # the engine answers, and has the runtime asked for (runsc: with RUNSC_ARGS)
    local runtimes
    runtimes=$(docker info --format '{{json .Runtimes}}' 2>/dev/null) || return 1
    [ -z "$RUNTIME" ] || python3 -c '
import json, sys
entry = json.loads(sys.argv[1]).get(sys.argv[2])
sys.exit(entry is None or not set(json.loads(sys.argv[3])) <= set(entry.get("runtimeArgs") or []))
' "$runtimes" "$RUNTIME" "$RUNSC_ARGS"
}

if known; then
    exit 0
fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    if docker info >/dev/null 2>&1; then
        cat >&2 <<MSG
sandcell: the Docker engine has no runtime "$RUNTIME" (gVisor) with the arguments $RUNSC_ARGS.
  - Install runsc (https://gvisor.dev/docs/user_guide/install/; Debian: apt-get install runsc),
    then add it to $DAEMON_JSON:
      {"runtimes": {"runsc": {"path": "$(command -v runsc || echo /usr/bin/runsc)", "runtimeArgs": $RUNSC_ARGS}}}
    and reload the engine without a restart: sudo kill -HUP \$(pidof dockerd)
  - As root on Debian/Ubuntu \`make engine RUNTIME=runsc\` does all of this by itself.
MSG
        exit 1
    fi
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

updated=no
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
[ "$RUNTIME" != runsc ] || command -v runsc >/dev/null 2>&1 || missing+=(runsc)
if [ ${#missing[@]} -gt 0 ]; then
    echo "sandcell: installing ${missing[*]} (apt-get)..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

starting=no
pgrep -x dockerd >/dev/null 2>&1 || starting=yes
if [ "$RUNTIME" = runsc ]; then
    # Merge the entry into daemon.json, keeping everything else; write only on a change.
    # A daemon this script starts also gets "experimental": true, which Docker's checkpoints
    # (paused sandboxes under gVisor) need; a running daemon is never switched: that needs a
    # restart of dockerd, which stops every container (see `sandcell doctor`).
    changed=$(python3 - "$DAEMON_JSON" "$(command -v runsc)" "$RUNSC_ARGS" "$starting" <<'PY'
import json, os, sys
path, binary, args, starting = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
config = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
entry = {"path": binary, "runtimeArgs": args}
experimental = starting == "yes" and config.get("experimental") is not True
if config.get("runtimes", {}).get("runsc") == entry and not experimental:
    print("no")
else:
    config.setdefault("runtimes", {})["runsc"] = entry
    if experimental:
        config["experimental"] = True
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".sandcell-new", "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.replace(path + ".sandcell-new", path)
    print("yes")
PY
)
    if [ "$changed" = yes ]; then
        echo "sandcell: registered runsc in $DAEMON_JSON" >&2
        if [ "$starting" = yes ]; then
            echo "sandcell: and \"experimental\": true there, for checkpoints (paused sandboxes under gVisor)" >&2
        else
            echo "sandcell: checkpoints stay off on the running dockerd (they need \"experimental\": true and a restart; see \`sandcell doctor\`)" >&2
        fi
        updated=yes
    fi
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
    echo "sandcell: starting dockerd (log: /var/log/sandcell-dockerd.log)..." >&2
    start_daemon /var/log/sandcell-dockerd.log dockerd
elif [ "$updated" = yes ] || { docker info >/dev/null 2>&1 && ! known; }; then
    echo "sandcell: reloading dockerd's configuration (SIGHUP, no restart)..." >&2
    kill -HUP "$(pgrep -x dockerd)"
fi

for _ in $(seq 1 60); do
    if known; then
        echo "sandcell: Docker engine is up${RUNTIME:+, with the $RUNTIME runtime}." >&2
        exit 0
    fi
    sleep 1
done
if docker info >/dev/null 2>&1; then
    echo "sandcell: dockerd does not list $RUNTIME after a reload; check $DAEMON_JSON" >&2
else
    echo "sandcell: dockerd did not answer within 60 s; see /var/log/sandcell-dockerd.log" >&2
fi
exit 1
