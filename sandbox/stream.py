"""The host's end of the stream transport: the kernel's channels over the engine's own API.

Where the engine cannot see the host's folders (a remote engine, Docker Desktop, Podman), no
socket file can be shared. A `StreamLink` starts the image's bridge (images/bridge.py) with
`docker exec` and binds, in a private folder of the host's, the same ipc sockets the relay
binds in the shared folder of the ipc transport; jupyter_client connects to them as it
would there (kernel.connect). Between the two, each channel's messages travel framed
(boundary.encode_message) in the exec's stdin and stdout, read back as untrusted bytes: a
message over the caps ends the link.

Three threads per link: the reader parses the exec's output and hands each message over an
inproc socket; the pump owns the host's sockets and moves messages both ways; the writer sends
to the exec's stdin, fed through a bounded queue so a stalled container never blocks the pump.
The host holds a message or two per channel, as over ipc: every socket of the link queues one
(FRONT_HWM), and a message jupyter_client cannot take yet waits in the pump, which then reads
no more from the bridge until it is taken; so the reader stops, the exec's stream stops, the
bridge stops, and the relay drops what it cannot pass on, in the container, as over ipc.
"""

import json
import queue
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import docker.errors
import requests
import zmq
from docker.models.containers import Container

from sandcell.sandbox import boundary
from sandcell.sandbox.container import BRIDGE_USER, exec_frames, exec_stream
from sandcell.sandbox.errors import SandboxError
from sandcell.sandbox.kernel import MAX_MESSAGE_BYTES

READY_TIMEOUT_S = 30.0  # the bridge's first word: it starts in well under a second
OUTBOX = 256  # host messages waiting for the exec's stdin; past it they are dropped
STDERR_BYTES = 16 << 10  # the bridge's last words kept, to say why it ended
END = b"end"  # the reader's last message to the pump
FRONT_HWM = 1  # messages ZMQ queues per socket of the link (each may be 16 MiB)


class Front:
    """One host socket jupyter_client connects to, and the message it could not take yet."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.waiting: list | None = None

    def deliver(self, frames: list) -> None:
        self.waiting = frames
        self.flush()

    def flush(self) -> None:
        if self.waiting is None:
            return
        try:
            self.sock.send_multipart(self.waiting, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return  # full: sent when it can take more (POLLOUT)
        except zmq.ZMQError:
            pass  # a ROUTER's peer that is gone: nobody to give it to
        self.waiting = None


class StreamLink:
    """One bridge in `container` and the host sockets jupyter_client connects to, in
    `folder` (the sandbox's, private to the host user). open() starts it; close() ends it
    (the bridge ends with its stdin)."""

    def __init__(self, container: Container, folder: str):
        self.container = container
        self.folder = folder
        self.context = zmq.Context()
        self.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.context.setsockopt(zmq.SNDHWM, FRONT_HWM)
        self.context.setsockopt(zmq.RCVHWM, FRONT_HWM)
        self.inbox = f"inproc://bridge-{uuid.uuid4().hex}"
        self.outbox: queue.Queue[bytes | None] = queue.Queue(OUTBOX)
        self.ready = threading.Event()
        self.reached: list | None = None  # the relay's socket files the bridge connected to
        self.ended: str | None = None  # why the link ended, once it has
        self.stderr = bytearray()
        self.threads: list[threading.Thread] = []
        self.raw: socket.socket | None = None
        self.stream: Any = None  # the exec's output, read through the response's reader

    # -- lifecycle ----------------------------------------------------------------------
    def open(self, key: dict | None, before: list | None, timeout: float) -> bool:
        """Start the bridge and hand it `key` (a new connection file for the supervisor) and
        `before` (the relay's socket files the last bridge reached: a new relay's are
        awaited). True once it said ready within `timeout`; False if it ended first (it
        could not start: a fork bomb still filling the sandbox's process limit)."""
        fronts = self._bind()
        try:
            self.raw, self.stream = exec_stream(
                self.container, ["python3", boundary.BRIDGE_PROGRAM], BRIDGE_USER
            )
        except (docker.errors.APIError, requests.exceptions.RequestException) as error:
            self.ended = f"it did not start ({error})"
            return False
        self._thread(self._read, self.stream)
        self._thread(self._pump, fronts)
        self._thread(self._write)
        first = json.dumps({"key": key, "before": before}).encode()
        self.outbox.put(boundary.encode_message(boundary.CONTROL, [first]))
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if self.ended is not None or time.monotonic() > deadline:
                return False
        return True

    def _bind(self) -> dict[int, Front]:
        """The host's sockets, which say when they are full rather than drop in silence."""
        fronts = {}
        for name, port in boundary.CHANNELS.items():
            pub = name == "iopub"
            sock = self.context.socket(zmq.XPUB if pub else zmq.ROUTER)
            sock.setsockopt(zmq.XPUB_NODROP if pub else zmq.ROUTER_MANDATORY, 1)
            sock.linger = 0
            sock.bind(f"ipc://{self.folder}/{boundary.socket_name(port)}")
            fronts[port] = Front(sock)
        return fronts

    def _thread(self, target: Callable[..., None], *args: Any) -> None:
        name = f"bridge{target.__name__}"
        thread = threading.Thread(target=target, args=args, daemon=True, name=name)
        thread.start()
        self.threads.append(thread)

    @classmethod
    def start(
        cls,
        container: Container,
        folder: str,
        key: dict | None,
        before: list | None,
        check: Callable[[], None],
    ) -> "StreamLink":
        """A link whose bridge said ready, tried again until READY_TIMEOUT_S: just after a
        restart's signal a fork bomb may still fill the process limit. `check` raises when
        the container stopped."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            link = cls(container, folder)
            try:
                if link.open(key, before, deadline - time.monotonic()):
                    return link
            except BaseException:  # re-raised: nothing of a failed link is left
                link.close()
                raise
            link.close()
            check()
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"the bridge to the kernel did not start within {READY_TIMEOUT_S:g} s "
                    f"({link.ended}; {link.stderr.decode(errors='replace').strip()[-300:]})"
                )
            time.sleep(0.2)

    def check(self) -> None:
        """Raise SandboxError if the link has ended (the bridge said why on its stderr)."""
        if self.ended is not None:
            said = self.stderr.decode(errors="replace").strip()[-500:]
            said = f" ({said})" if said else ""
            raise SandboxError(f"the bridge to the kernel ended: {self.ended}{said}")

    def close(self) -> None:
        """End the bridge (its stdin closes) and the threads."""
        if self.ended is None:
            self.ended = "closed"
        self._shut()  # the engine closes the exec's stdin; the reader's read returns
        try:
            self.outbox.put_nowait(None)  # the writer ends (it may have already)
        except queue.Full:
            pass
        for thread in self.threads:
            thread.join(timeout=5)
        if self.stream is not None:
            self.stream.close()  # it holds the socket open (makefile's reference) until then
        if self.raw is not None:
            self.raw.close()
        if any(thread.is_alive() for thread in self.threads):  # ZMQ's close is not thread-safe
            warnings.warn(
                "a thread of the bridge link did not end: its sockets are left open", stacklevel=2
            )
            return
        self.context.destroy(linger=0)

    # -- the threads -----------------------------------------------------------------------
    def _read(self, stream: Any) -> None:
        """The exec's output: stdout as messages for the pump, stderr kept (its tail)."""
        handoff = self.context.socket(zmq.PAIR)
        handoff.connect(self.inbox)
        reader = boundary.MessageReader(MAX_MESSAGE_BYTES)
        why = "the bridge's output ended"
        try:
            for stream_id, payload in exec_frames(stream):
                if stream_id != 1:
                    self.stderr += payload
                    del self.stderr[:-STDERR_BYTES]
                    continue
                for channel, frames in reader.feed(payload):
                    if channel == boundary.CONTROL:
                        self._said(frames)
                    else:
                        handoff.send_multipart([bytes([channel]), *frames], copy=False)
        except ValueError as error:  # a message over the caps, or no message at all
            why = f"it sent what is not a message ({error})"
        except OSError as error:
            why = f"its stream failed ({error})"
        finally:
            if self.ended is None:
                self.ended = why
            handoff.send_multipart([END])
            handoff.close(linger=0)

    def _said(self, frames: list[bytes]) -> None:
        """The bridge's own word: ready, or the relay's socket files it connected to."""
        try:
            said = json.loads(frames[0]) if len(frames) == 1 else {}
        except ValueError:
            said = {}
        if not isinstance(said, dict):
            return
        if said.get("ready") is True:
            self.ready.set()
        reached = said.get("connected")
        if isinstance(reached, list) and len(reached) == len(boundary.CHANNELS):
            self.reached = [identity(r) for r in reached]

    def _pump(self, fronts: dict[int, Front]) -> None:
        inbox = self.context.socket(zmq.PAIR)
        inbox.bind(self.inbox)
        poller = zmq.Poller()
        ports = {front.sock: port for port, front in fronts.items()}
        try:
            while True:
                # a message jupyter_client has not taken yet holds the bridge's back
                held = any(front.waiting is not None for front in fronts.values())
                poller.register(inbox, 0 if held else zmq.POLLIN)
                for front in fronts.values():
                    waiting = zmq.POLLOUT if front.waiting is not None else 0
                    poller.register(front.sock, zmq.POLLIN | waiting)
                for sock, event in poller.poll():
                    if sock is inbox:
                        frames = inbox.recv_multipart(copy=False)
                        if frames[0].bytes == END:
                            return
                        fronts[frames[0].bytes[0]].deliver(frames[1:])
                        continue
                    if event & zmq.POLLOUT:
                        fronts[ports[sock]].flush()
                    if event & zmq.POLLIN:
                        frames = sock.recv_multipart()
                        try:
                            self.outbox.put_nowait(boundary.encode_message(ports[sock], frames))
                        except queue.Full:
                            pass  # the bridge has stopped reading: a dropped request times out
        except Exception as error:  # the link is over; the reader's read ends with the stream
            if self.ended is None:
                self.ended = f"its pump failed ({error!r})"
            self._shut()
        finally:
            for sock in (inbox, *ports):
                sock.close(linger=0)

    def _shut(self) -> None:
        if self.raw is not None:
            try:
                self.raw.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _write(self) -> None:
        assert self.raw is not None
        while (data := self.outbox.get()) is not None:
            try:
                self.raw.sendall(data)
            except OSError:
                break
        try:
            self.raw.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def identity(said: object) -> list[int] | None:
    """A socket file's (inode, ctime) as the bridge said it; anything else is none."""
    if isinstance(said, list) and len(said) == 2 and all(type(n) is int for n in said):
        return said
    return None
