"""The container's end of the stream transport (the host's end: sandbox/stream.py).

Where the host shares no folder with the engine (a remote engine, Docker Desktop, Podman),
it reaches the relay through this program, run with `docker exec` as a uid of its own
(boundary.BRIDGE_UID_OFFSET) with the exec's stdin and stdout as its stream. In order it
1. reads the host's first message: {"key": a connection file or null, "before": the
   identities of the relay's socket files the last bridge reached, or null}; a key goes into
   boundary.KEY_DIR (this uid's alone), where the supervisor waits for it;
2. says ready;
3. waits until every socket file is there and none is one of `before` (after a restart it
   must reach the new relay, never the old one in its last moments), connects to the relay,
   says which files it reached, and carries each channel's messages both ways, framed
   (boundary.encode_message) and bounded as the relay bounds them, until its stdin ends.

Non-dumpable, and of another uid than model code, so model code can neither ptrace it nor
open its /proc/<pid>/fd to write into the host's stream. What it writes goes through a pipe
and `cat`: under gVisor a Python write to an exec's stdout past its first 64 KiB is lost.
"""

import ctypes
import json
import os
import select
import sys

import boundary
import zmq

MAX_MESSAGE_BYTES = int(os.environ.get(boundary.MAX_MESSAGE_ENV, str(boundary.MAX_MESSAGE_BYTES)))
HOST_BODY_BYTES = 2 * MAX_MESSAGE_BYTES  # what the host sends: requests, a cell's code
STASHED = 256  # host messages kept while the relay is not there yet; more are dropped
SOCKETS = [
    (port, f"{boundary.CONNECTION_DIR}/{boundary.socket_name(port)}", name == "iopub")
    for name, port in boundary.CHANNELS.items()
]


def identities() -> list:
    """(inode, ctime) of each of the relay's socket files; None where absent."""
    found = []
    for _, path, _ in SOCKETS:
        try:
            st = os.stat(path)
            found.append((st.st_ino, st.st_ctime_ns))
        except OSError:
            found.append(None)
    return found


class Stream:
    """stdin read as messages; messages written to stdout through `cat`."""

    def __init__(self) -> None:
        self.reader = boundary.MessageReader(HOST_BODY_BYTES)
        self.ended = False
        read_end, self.out = os.pipe()
        if os.fork() == 0:
            os.dup2(read_end, 0)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            os.execv("/bin/cat", ["cat"])
        os.close(read_end)

    def read(self) -> list:
        """The messages that came with one read of stdin (call when it is readable)."""
        data = os.read(0, 1 << 16)
        if not data:
            self.ended = True
            return []
        return self.reader.feed(data)

    def write(self, channel: int, frames: list) -> None:
        data = memoryview(boundary.encode_message(channel, frames))
        while data:
            data = data[os.write(self.out, data) :]


def hand_over(info: dict) -> None:
    """The connection file where the supervisor reads it as it next starts a kernel: in a
    folder of this uid's, replaced whole (never read half-written)."""
    temporary = f"{boundary.KEY_DIR}/.{boundary.CONNECTION_FILE}"
    try:  # one a bridge left half-written (it is 0444: it could not be opened again)
        os.unlink(temporary)
    except FileNotFoundError:
        pass
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(temporary, f"{boundary.KEY_DIR}/{boundary.CONNECTION_FILE}")


def first_message(stream: Stream) -> tuple[dict, list]:
    """The host's first message, and any that came after it in the same read."""
    while not stream.ended:
        select.select([0], [], [])
        messages = stream.read()
        if messages:
            channel, frames = messages[0]
            if channel != boundary.CONTROL or len(frames) != 1:
                raise ValueError("the host's first message is not the bridge's")
            return json.loads(frames[0]), messages[1:]
    sys.exit(0)


def await_new_relay(stream: Stream, before: list, stashed: list) -> bool:
    """Wait for a socket file of a new relay on every channel; what the host sends meanwhile
    is kept (up to STASHED). False if the host went away."""
    while True:
        now = identities()
        if all(new is not None and new != old for new, old in zip(now, before, strict=True)):
            return True
        if select.select([0], [], [], 0.01)[0]:
            stashed.extend(stream.read())
            del stashed[:-STASHED]
            if stream.ended:
                return False


def control(stream: Stream, **said: object) -> None:
    stream.write(boundary.CONTROL, [json.dumps(said).encode()])


def main() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    stream = Stream()
    first, stashed = first_message(stream)
    if first.get("key") is not None:
        hand_over(first["key"])
    control(stream, ready=True)
    before = [tuple(old) if old else None for old in first.get("before") or [None] * len(SOCKETS)]
    if not await_new_relay(stream, before, stashed):
        return
    reached = identities()
    context = zmq.Context()
    poller = zmq.Poller()
    by_port, ports = {}, {}
    for port, path, pub in SOCKETS:
        sock = context.socket(zmq.XSUB if pub else zmq.DEALER)
        sock.setsockopt(zmq.RECONNECT_IVL, 10)
        sock.connect(f"ipc://{path}")
        by_port[port], ports[sock] = sock, port
        poller.register(sock, zmq.POLLIN)
    poller.register(0, zmq.POLLIN)
    control(stream, connected=reached)
    pending = stashed
    while not stream.ended:
        for channel, frames in pending:
            if channel in by_port:
                try:
                    by_port[channel].send_multipart(frames, flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # the relay is not reading: drop rather than block, as it does
        pending = []
        for item, _ in poller.poll():
            if item == 0:
                pending = stream.read()
                continue
            frames = item.recv_multipart(copy=False)
            size = sum(len(f) for f in frames)
            if size > MAX_MESSAGE_BYTES or not 0 < len(frames) <= boundary.STREAM_MAX_FRAMES:
                continue  # the relay drops such a message: this one came from elsewhere
            stream.write(ports[item], [f.buffer for f in frames])


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        pass  # the host went away
    except (OSError, ValueError) as error:
        sys.exit(f"bridge: {error}")
