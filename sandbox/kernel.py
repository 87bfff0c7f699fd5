"""Host side of the kernel connection: a sealed ipc connection directory, a jupyter_client
with bounded ZMQ sockets, and one cell executed against a deadline into an Execution
whose output is capped as it arrives (the host never holds an unbounded stream)."""

import json
import os
import re
import secrets
import tempfile
import time
from collections import deque
from collections.abc import Callable
from queue import Empty
from typing import cast

import zmq
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import KernelConnectionInfo

from sandcell.sandbox import boundary, event_loops
from sandcell.sandbox.execution import CUT_NOTE, Execution, ExecutionError, Result, StreamChunk

MAX_MESSAGE_BYTES = 32 << 20  # a single ZMQ message larger than this is refused
# Whole messages the host queues per socket before ZMQ stops reading; the kernel side
# queues the rest in the container's memory. Not a hard bound on its own (one message may
# carry many frames of up to MAX_MESSAGE_BYTES each): the relay in the container drops any
# message over 16 MiB before it reaches the host (see images/relay.py).
RECEIVE_HWM = 2
RICH_KINDS = ("execute_result", "display_data")
DATA_FORMATS = (boundary.CHART_MIME, boundary.TABLE_MIME)  # a chart's and a table's data
# A display whose message passes what is left of the rich byte cap by this much can never be
# kept (its JSON is its rich_size plus quotes, escapes and headers): it is counted unread.
UNREAD_SLACK, UNREAD_FLOOR = 1.25, 64 << 10
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
CONN_PREFIX = "sandcell-conn-"  # the host folders sandcell made, and may delete
OnOutput = Callable[[StreamChunk], None]


def make_connection_dir(info: dict | None = None) -> tuple[str, dict]:
    """A host-owned directory the container's kernel binds its ipc sockets in; `info` is a
    restored kernel's connection (its key), else a new one."""
    path = tempfile.mkdtemp(prefix=CONN_PREFIX)
    unseal(path)  # the kernel's uid creates its sockets here until sealed
    info = info or new_connection_info()
    with open(os.path.join(path, boundary.CONNECTION_FILE), "w") as f:
        json.dump(info, f)
    os.chmod(os.path.join(path, boundary.CONNECTION_FILE), 0o444)
    return path, info


def new_connection_info() -> dict:
    """A connection file's content with a new key: the relay's sockets in the container."""
    return dict(
        transport="ipc",
        ip=f"{boundary.CONNECTION_DIR}/{boundary.SOCKET_BASE}",
        **{f"{name}_port": port for name, port in boundary.CHANNELS.items()},
        key=secrets.token_hex(32),
        signature_scheme="hmac-sha256",
        kernel_name="",
    )


def seal(path: str) -> None:
    os.chmod(path, 0o555)  # host-owned: the kernel can neither add files nor chmod it back


def unseal(path: str) -> None:
    # A fresh kernel must replace its socket files. Sticky: while model code of the old
    # kernel still runs, it must not rename or delete the host's kernel.json.
    os.chmod(path, 0o1777)


PORTS = tuple(f"{name}_port" for name in boundary.CHANNELS)


def socket_files(path: str, info: dict) -> list[tuple[int, int] | None]:
    """Identity (inode, ctime) of each socket file the relay binds; None where absent."""
    ids: list[tuple[int, int] | None] = []
    for port in PORTS:
        try:
            st = os.stat(os.path.join(path, boundary.socket_name(info[port])))
            ids.append((st.st_ino, st.st_ctime_ns))
        except FileNotFoundError:
            ids.append(None)
    return ids


def await_new_sockets(
    path: str, info: dict, before: list, timeout: float, check: Callable[[], None] | None = None
) -> bool:
    """After a hard restart, wait until a new relay has bound every socket afresh. Connecting
    sooner can reach the old relay in its last moments: the old kernel answers the readiness
    check, then dies, and the next cell's output is lost or runs in the old state."""

    def fresh(now: list) -> bool:
        return all(new is not None and new != old for new, old in zip(now, before, strict=True))

    return await_sockets(path, info, fresh, timeout, check)


def await_sockets(
    path: str,
    info: dict,
    done: Callable[[list], bool],
    timeout: float,
    check: Callable[[], None] | None = None,
) -> bool:
    """Wait until done(socket_files(...)) holds; False at the timeout. `check`, called about
    once a second, raises to end the wait early (the container stopped)."""
    deadline = time.monotonic() + timeout
    next_check = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        if done(socket_files(path, info)):
            return True
        if check is not None and time.monotonic() >= next_check:
            check()
            next_check = time.monotonic() + 1.0
        time.sleep(0.01)
    return False


def rotate_key(path: str, info: dict) -> dict:
    """The connection info with a new key, written into the connection file in place: the
    file is bind-mounted into the container on its own, so a new file would not be seen. The
    supervisor reads it when it next starts a kernel."""
    fresh = dict(info, key=secrets.token_hex(32))
    file = os.path.join(path, boundary.CONNECTION_FILE)
    os.chmod(file, 0o644)
    with open(file, "w") as f:  # truncates the same inode
        json.dump(fresh, f)
    os.chmod(file, 0o444)
    return fresh


def connect(
    path: str, info: dict, ready_timeout: float, check: Callable[[], None] | None = None
) -> BlockingKernelClient:
    event_loops.install()  # the blocking client's per-thread loops, closed at exit
    context = zmq.Context()
    context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    context.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    client = BlockingKernelClient(context=context)
    # info is a connection file's content (make_connection_dir): jupyter_client's keys
    here = cast(KernelConnectionInfo, dict(info, ip=os.path.join(path, boundary.SOCKET_BASE)))
    client.load_connection_info(here)
    try:
        client.start_channels(hb=False)  # liveness: see beating()
        wait_until_ready(client, ready_timeout, check)
    except BaseException:  # re-raised; the ZMQ context must not leak
        disconnect(client)
        raise
    return client


def beating(client: BlockingKernelClient, path: str, info: dict, timeout: float = 0.5) -> bool:
    """One heartbeat ping, asked only when a cell has gone quiet. Not jupyter_client's
    heartbeat thread: stopped right after it starts, it spins creating sockets until ZMQ
    runs out of them."""
    sock = client.context.socket(zmq.REQ)
    sock.linger = 0
    try:
        sock.connect(f"ipc://{os.path.join(path, boundary.socket_name(info['hb_port']))}")
        sock.send(b"ping")
        return sock.poll(int(timeout * 1000)) != 0
    finally:
        sock.close(linger=0)


def wait_until_ready(
    client: BlockingKernelClient, timeout: float, check: Callable[[], None] | None = None
) -> None:
    """Ask kernel_info until the shell answers and iopub delivers (ZMQ subscriptions join
    late, so one iopub message proves the first cell's output will not be missed).
    Not jupyter_client's wait_for_ready: it takes a missing heartbeat during a slow start
    under load for a dead kernel. `check`, called about once a second, raises to end the
    wait early (the container stopped)."""
    deadline = time.monotonic() + timeout
    next_check = time.monotonic() + 0.5
    wait = 0.02  # a request sent before the kernel binds is dropped by the relay: ask again
    while time.monotonic() < deadline:
        if check is not None and time.monotonic() >= next_check:
            check()
            next_check = time.monotonic() + 1.0
        msg_id = client.kernel_info()
        answered = False
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = client.get_shell_msg(timeout=min(wait, left))
            except Empty:
                break
            if msg["parent_header"].get("msg_id") == msg_id:
                answered = True
                break
        wait = min(1.0, wait * 1.5)  # often at first (a forked kernel starts in 0.1 s), then less
        if not answered:
            continue
        try:
            client.get_iopub_msg(timeout=min(0.5, wait))
        except Empty:
            continue
        while True:  # discard the rest of the startup chatter
            try:
                client.get_iopub_msg(timeout=0.05)
            except Empty:
                return
    raise RuntimeError(f"the kernel did not answer within {timeout:.0f} s")


def disconnect(client: BlockingKernelClient) -> None:
    client.stop_channels()
    client.context.destroy(linger=0)


def interrupt(client: BlockingKernelClient) -> None:
    client.control_channel.send(client.session.msg("interrupt_request", {}))


class Collector:
    """Builds an Execution from iopub messages, keeping at most `cap` characters of
    stream text: the head, then a rolling tail; the middle between them is one cut whose
    size is exact (the kernel's count of what it cut, plus the host's own).
    `on_output` gets each piece of stream text as it is kept. Rich outputs are kept while
    within `rich_outputs` and `rich_bytes` (boundary.rich_size), like the kernel's own cap:
    model code can get round that one, so a result past either cap is counted, not kept."""

    def __init__(
        self,
        code: str,
        cap: int,
        on_output: OnOutput | None = None,
        *,
        rich_outputs: int = boundary.RICH_OUTPUTS,
        rich_bytes: int = boundary.RICH_BYTES,
    ):
        self.execution = Execution(code=code)
        self.cap = cap
        self.rich_outputs, self.rich_bytes = rich_outputs, rich_bytes
        self.rich_kept_bytes = 0
        self.kernel_rich = (0, 0)  # the kernel's count and size of what it did not send
        self.kept = 0
        self.in_tail = False  # once anything is cut or the head is full, text joins the tail
        self.tail: deque[StreamChunk] = deque()
        self.tail_chars = 0
        self.cut_stream = "stdout"
        self.on_output = on_output
        self.streamed = 0
        self.callback_error: BaseException | None = None

    def add(self, msg: dict) -> bool:
        """Take one iopub message; True when the cell has finished (status idle)."""
        kind, content = msg["msg_type"], msg["content"]
        ex = self.execution
        if kind == "status":
            return content["execution_state"] == "idle"
        if kind == "execute_input":
            ex.execution_count = content.get("execution_count")
        elif kind == "stream":
            for piece in boundary.split_markers(content["text"]):
                if isinstance(piece, tuple):
                    self._marker(*piece)
                else:  # after the markers: an ANSI pattern would eat their escape
                    self._text(content["name"], ANSI.sub("", piece))
        elif kind in RICH_KINDS and content is None:  # too big to unpack: see next_iopub
            self._drop_rich(msg["wire_bytes"])
        elif kind in RICH_KINDS:
            self._rich(content, is_main=kind == "execute_result")
        elif kind == "error":
            ex.error = ExecutionError(
                name=content["ename"],
                value=content["evalue"],
                traceback=compact_traceback(content.get("traceback", [])),
            )
        return False

    def unread_over(self) -> int:
        """Message size past which a display cannot fit in what is left of the byte cap."""
        left = max(0, self.rich_bytes - self.rich_kept_bytes)
        return int(left * UNREAD_SLACK) + UNREAD_FLOOR

    def _drop_rich(self, size: int) -> None:
        self.execution.rich_dropped += 1  # the message goes with the caller's reference to it
        self.execution.rich_dropped_bytes += size

    def _rich(self, content: dict, is_main: bool) -> None:
        ex = self.execution
        data, metadata = content.get("data"), content.get("metadata")
        size = boundary.rich_size(data, metadata)
        if len(ex.results) >= self.rich_outputs or self.rich_kept_bytes + size > self.rich_bytes:
            self._drop_rich(size)
            return
        self.rich_kept_bytes += size
        # texts only; the data formats too when not (rich_data says so instead of dropping them)
        data = (
            {k: v for k, v in data.items() if isinstance(v, str) or k in DATA_FORMATS}
            if isinstance(data, dict)
            else {}
        )
        metadata = metadata if isinstance(metadata, dict) else {}
        result = Result(data=data, metadata=metadata, is_main=is_main)
        if boundary.CHART_MIME in data or boundary.TABLE_MIME in data:
            from sandcell.sandbox import rich_data  # pydantic's models: only when needed

            result.chart, result.table, result.notes = rich_data.taken(data)
        ex.results.append(result)

    def _marker(self, kind: str, value: str) -> None:
        """A marker from the container. Model code can print one too: one that is not what
        the container writes is dropped (it must neither crash the host nor point anywhere)."""
        ex = self.execution
        try:
            if kind == "rich":  # the kernel's comes last: it replaces any printed before it
                self.kernel_rich = boundary.parse_rich(value)
                return
            if kind != "dropped" and not boundary.valid_spill(kind, value):
                raise ValueError(value)
            source, count = boundary.parse_dropped(value) if kind == "dropped" else ("", 0)
        except ValueError:
            return
        if kind == "spill":
            ex.saved_output = value
        elif kind == "spill-full":
            ex.saved_truncated = int(value)
        else:
            if source == boundary.RELAY:  # a whole message, in bytes: not part of the stream
                ex.dropped_bytes += count
                return
            # the kernel cut here: what the host kept since its head ends joins the cut
            self._cut(source, count + self.tail_chars)
            self.tail.clear()
            self.tail_chars = 0
            self._emit(source, CUT_NOTE.format(n=count), counted=False)

    def _text(self, name: str, text: str) -> None:
        if not self.in_tail:
            room = self.cap // 2 - self.kept
            head, text = text[:room], text[room:]
            if head:
                self._append(name, head)
                self.kept += len(head)
                self._emit(name, head)
            self.in_tail = bool(text)
        if not text:
            return
        self.tail.append(StreamChunk(name, text))
        self.tail_chars += len(text)
        self._emit(name, text)
        while self.tail_chars - len(self.tail[0].text) >= self.cap // 2:
            dropped = self.tail.popleft()
            self.tail_chars -= len(dropped.text)
            self._cut(dropped.name, len(dropped.text))

    def _cut(self, name: str, count: int) -> None:
        ex = self.execution
        if not ex.cut_chars:
            self.cut_stream = name
        ex.cut_chars += count
        ex.dropped_bytes += count
        self.in_tail = True

    def _emit(self, name: str, text: str, counted: bool = True) -> None:
        """Pass text to on_output, within the cap; an error there stops the streaming and
        is raised once the cell is done (the cell itself runs on)."""
        if self.on_output is None or self.callback_error is not None:
            return
        if counted:
            text = text[: max(0, self.cap - self.streamed)]
            self.streamed += len(text)
        if not text:
            return
        try:
            self.on_output(StreamChunk(name, text))
        except Exception as error:
            self.callback_error = error

    def _append(self, name: str, text: str) -> None:
        stream = self.execution.stream
        if stream and stream[-1].name == name and len(stream) - 1 != self.execution.cut_at:
            stream[-1].text += text
        else:
            stream.append(StreamChunk(name, text))

    def finish(self, duration: float) -> Execution:
        ex = self.execution
        excess = self.tail_chars - self.cap // 2
        if excess > 0:  # trim the oldest tail chunk so head + tail stay within the cap
            self.tail[0].text = self.tail[0].text[excess:]
            self.tail_chars -= excess
            self._cut(self.tail[0].name, excess)
        if ex.cut_chars:
            ex.cut_at = len(ex.stream)
            ex.stream.append(StreamChunk(self.cut_stream, CUT_NOTE.format(n=ex.cut_chars)))
        for chunk in self.tail:
            self._append(chunk.name, chunk.text)
        self.tail.clear()
        ex.rich_dropped += self.kernel_rich[0]
        ex.rich_dropped_bytes += self.kernel_rich[1]
        self.kernel_rich = (0, 0)
        ex.duration_s = duration
        return ex


def compact_traceback(frames: list[str]) -> list[str]:
    """Drop ANSI codes and the frames inside IPython/library internals; keep the frames of
    the user's cell (`Cell In[...]`, `<ipython-input`) and the final error line."""
    clean = [ANSI.sub("", f) for f in frames]
    kept = [f for f in clean if "Cell In[" in f or "<ipython-input" in f or "File <string>" in f]
    last = clean[-1] if clean else ""
    if last and last not in kept:
        kept.append(last)
    return kept or clean[-3:]


def drain(
    client: BlockingKernelClient,
    msg_id: str,
    collector: Collector,
    deadline: float,
    poll: float = 0.25,
) -> str:
    """Read iopub until the cell is idle or the deadline passes.
    Returns "done", "deadline" or "silent" (no message within `poll`: caller checks life)."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "deadline"
        try:
            msg = next_iopub(client, min(poll, remaining), collector.unread_over())
        except Empty:
            return "silent"
        if msg["msg_type"] == UNREADABLE:  # counted as dropped; the deadline still holds
            collector.execution.dropped_bytes += msg["wire_bytes"]
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if collector.add(msg):
            return "done"


# A message the host cannot read (model code replaced the kernel's JSON packer): its bytes are
# counted as dropped output, never raised; the cell then ends at its deadline.
UNREADABLE = "sandcell_unreadable"


def next_iopub(client: BlockingKernelClient, timeout: float, unread_over: int) -> dict:
    """The next iopub message, as client.get_iopub_msg gives it (Empty when none comes in
    `timeout`). A display bigger than `unread_over` bytes is not unpacked: unpacking makes
    three copies of it (bytes, text, JSON) in this process, only to drop it. It comes with
    content None and its size as `wire_bytes`."""
    socket, session = client.iopub_channel.socket, client.session
    if not socket.poll(int(timeout * 1000)):
        raise Empty
    frames = socket.recv_multipart(copy=False)  # zmq.Frame: no copy yet
    _, frames = session.feed_identities(frames, copy=False)
    size = sum(len(frame) for frame in frames)
    # [signature, header, parent header, metadata, content, buffers...]
    try:
        if size > unread_over and len(frames) >= 5 and max(map(len, frames[1:3])) < UNREAD_FLOOR:
            header = session.unpack(frames[1].bytes)
            if header.get("msg_type") in RICH_KINDS:
                parent = session.unpack(frames[2].bytes)
                return dict(
                    msg_type=header["msg_type"], parent_header=parent, content=None, wire_bytes=size
                )
        return session.deserialize(frames, copy=False)
    except ValueError:  # not JSON, or a replayed signature: model code broke the kernel's packer
        return dict(msg_type=UNREADABLE, parent_header={}, content=None, wire_bytes=size)


def flush_shell(client: BlockingKernelClient) -> None:
    """Discard shell replies left by cells that timed out, without waiting."""
    while True:
        try:
            client.get_shell_msg(timeout=0)
        except Empty:
            return
        except ValueError:  # unreadable (see next_iopub): discarded all the same
            continue


def await_reply(client: BlockingKernelClient, msg_id: str, timeout: float = 2.0) -> dict | None:
    """The execute_reply of msg_id; it arrives together with the idle status."""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        try:
            msg = client.get_shell_msg(timeout=left)
        except Empty:
            return None
        except ValueError:  # unreadable (see next_iopub): not the reply we can use
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
    return None
