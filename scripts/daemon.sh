# Sourced by scripts/ensure-docker.sh and ensure-podman.sh.
#
# start_daemon LOG COMMAND...: COMMAND started in the background, for good: from / (it outlives
# the folder it was started in: a CI clone removed and cloned again), in a session of its own
# (a Ctrl-C to make is not its), stdin from /dev/null, its output appended to LOG. The
# redirections are the subshell's, which then becomes COMMAND: nothing is left holding the
# caller's stdout (CI reads it through a pipe and ends only when every writer has).
start_daemon() {
    local log=$1
    shift
    (cd / && exec setsid "$@") </dev/null >>"$log" 2>&1 &
}
