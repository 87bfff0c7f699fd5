"""Bounded relay between the host and the kernel, inside the container.

The kernel runs model code, so whatever it sends may be hostile, and ZMQ holds a whole
message (any number of frames) in the receiver's memory before handing over the first
frame. So the host never connects to the kernel: it connects to this relay, which receives
the kernel's messages here, where the container's memory limit bounds them, and forwards only
messages under a size cap. A message dropped on iopub is replaced by a short signed stream
message that the host counts as dropped output.

Started by the supervisor (restarted with every fresh kernel); non-dumpable, so model code
running as the same uid can neither ptrace it nor make it forward more.
"""

import ctypes
import datetime
import hashlib
import hmac
import json
import os
import sys
import uuid

import boundary
import zmq

MAX_MESSAGE_BYTES = int(os.environ.get(boundary.MAX_MESSAGE_ENV, str(boundary.MAX_MESSAGE_BYTES)))
MAX_FRAMES = 64
DELIMITER = b"<IDS|MSG>"


def dropped_notice(frames: list, size: int, key: bytes) -> list[bytes] | None:
    """A stream message, signed like the kernel's, saying a message was dropped; attributed
    to the same cell (parent header) so the host shows it with that cell's output."""
    heads = [bytes(f) if len(f) <= 64 else b"" for f in frames[:MAX_FRAMES]]
    if DELIMITER not in heads:
        return None
    at = heads.index(DELIMITER)
    parent = (
        bytes(frames[at + 3]) if len(frames) > at + 3 and len(frames[at + 3]) < 65536 else b"{}"
    )
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": "stream",
        "username": "sandcell",
        "session": "relay",
        "date": datetime.datetime.now(datetime.UTC).isoformat(),
        "version": "5.3",
    }
    content = {"name": "stderr", "text": boundary.dropped_marker("relay", size)}
    parts = [json.dumps(header).encode(), parent, b"{}", json.dumps(content).encode()]
    signature = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        signature.update(part)
    return [b"stream", DELIMITER, signature.hexdigest().encode(), *parts]


def main() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    internal, connection_file = sys.argv[1], sys.argv[2]
    if os.environ.get(boundary.STREAMED_ENV) == "1":
        os.umask(0o007)  # its sockets reachable by the host's bridge: the sandbox's group
    with open(connection_file) as f:
        key = json.load(f)["key"].encode()
    # No per-frame ZMQ limit here: a frame over it would drop the kernel's connection, and
    # with it the rest of the cell's output. The container's memory bounds what arrives;
    # the total of each message is checked below.
    context = zmq.Context()
    poller = zmq.Poller()
    peer = {}  # socket -> the socket its messages go to
    from_kernel = set()
    iopub_front = None
    for name, port in boundary.CHANNELS.items():
        pub = name == "iopub"
        front = context.socket(zmq.XPUB if pub else zmq.ROUTER)
        back = context.socket(zmq.XSUB if pub else zmq.DEALER)
        front.bind(f"ipc://{boundary.CONNECTION_DIR}/{boundary.socket_name(port)}")
        back.setsockopt(zmq.RECONNECT_IVL, 10)  # the kernel binds after us: find it soon
        back.connect(f"ipc://{internal}-{port}")
        peer[front], peer[back] = back, front
        from_kernel.add(back)
        iopub_front = front if pub else iopub_front
        poller.register(front, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
    while True:
        for sock, _ in poller.poll():
            frames = sock.recv_multipart(copy=False)
            if sock in from_kernel:
                size = sum(len(f) for f in frames)
                if size > MAX_MESSAGE_BYTES or len(frames) > MAX_FRAMES:
                    notice = (
                        dropped_notice(frames, size, key) if peer[sock] is iopub_front else None
                    )
                    del frames  # free it now, before anything else arrives
                    if notice is None:
                        continue
                    frames = notice
            try:
                peer[sock].send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass  # the other side is not reading: drop rather than block the relay


if __name__ == "__main__":
    main()
