"""Inside the container: the loopback port that HTTP_PROXY and HTTPS_PROXY name when the
sandbox has an allowlist (`--allow-net`). The container has no network interface; each
connection accepted here is carried, byte for byte, to the host's proxy for this sandbox,
which decides. Two ways, as the kernel's channels go:

- ipc transport: over the Unix socket the host put in the container (boundary.NET_SOCKET);
- stream transport (no folder shared with the engine): the forwarder listens on NET_SOCKET
  (a tmpfs of its own) as a dock, where the host keeps a few `docker exec`s of this program
  waiting (`--pipe`, as the bridge's uid); each connection goes to the next waiting one, whose
  stdin and stdout are the exec's stream to the host, which then reaches its proxy.

Nothing is decided here: a connection the host refuses gets the host's answer. At most
MOST connections are carried at once; more are closed at once (the host caps them lower)."""

import os
import queue
import socket
import sys
import threading
from collections.abc import Callable

MOST = 16
CHUNK = 64 << 10
WAIT_S = 10.0  # for a waiting pipe of the host's (stream transport): its connect time
TAKEN = b"\x01"  # the dock to a pipe, before any byte of its client's


def carry(client: socket.socket, reach: Callable[[], socket.socket], slots) -> None:
    """One connection: to the host (`reach`), then both ways until either side ends."""
    try:
        with client, reach() as host:
            back = threading.Thread(target=pipe, args=(host, client), daemon=True)
            back.start()
            pipe(client, host)
            back.join()
    except (OSError, queue.Empty):
        pass  # the host's proxy is gone (the sandbox is closing), none waits, or the client left
    finally:
        slots.release()


def pipe(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from source to sink; at source's end, sink hears that nothing more comes."""
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (sink, source):
            try:
                end.shutdown(socket.SHUT_WR if end is sink else socket.SHUT_RD)
            except OSError:
                pass


def serve(
    listener: socket.socket, reach: Callable[[], socket.socket], stop: threading.Event | None = None
) -> None:
    """Accept on `listener` (bound to loopback) until `stop` is set or it is closed."""
    slots = threading.BoundedSemaphore(MOST)
    while stop is None or not stop.is_set():
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed
        if not slots.acquire(blocking=False):
            client.close()
            continue
        threading.Thread(target=carry, args=(client, reach, slots), daemon=True).start()


def listening(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(MOST)
    return listener


def connector(path: str) -> Callable[[], socket.socket]:
    """ipc: a new connection to the host's socket at `path` each time."""

    def reach() -> socket.socket:
        host = socket.socket(socket.AF_UNIX)
        try:
            host.connect(path)
        except OSError:
            host.close()
            raise
        return host

    return reach


def dock(path: str) -> Callable[[], socket.socket]:
    """stream: the host's pipes connect to `path` and wait; each connection takes the next
    one still there (a pipe whose exec ended has hung up: left), and says TAKEN to it. The dock
    is a socket of model code's uid: what comes through it is no more trusted by the host than
    a client's bytes are."""
    try:
        os.unlink(path)  # the last forwarder's (a kernel restart starts a new one)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    os.chmod(path, 0o660)  # the bridge's uid reaches it through the group
    listener.listen(MOST)
    waiting: queue.Queue[socket.socket] = queue.Queue(MOST)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                os._exit(1)  # a broken dock: the supervisor starts a new forwarder
            try:
                waiting.put_nowait(conn)
            except queue.Full:
                conn.close()

    threading.Thread(target=accept, daemon=True).start()

    def reach() -> socket.socket:
        while True:
            conn = waiting.get(timeout=WAIT_S)
            try:
                conn.sendall(TAKEN)  # the host starts the next pipe and reaches its proxy
                return conn
            except OSError:
                conn.close()  # hung up: its exec ended

    return reach


def run_pipe(path: str) -> None:
    """`--pipe`: one connection's way between the dock and this exec's stdin and stdout. It
    waits at the dock; a hang-up before TAKEN (a forwarder restarted) ends it at once, so the
    host starts another. The client's bytes go to stdout through a `cat` (under gVisor a
    Python write to an exec's stdout past its first 64 KiB is lost), the host's from stdin to
    the client through another. An exec's stdout has no end of its own to tell the host, and
    its stderr may overtake it: when the client sends no more, stderr says how many bytes
    stdout carried in all (the host half-closes the proxy's side once it has them); the end of
    stdin is passed on to the client as the end of what comes."""
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(path)
    data = conn.recv(CHUNK)  # TAKEN first
    if not data:
        return
    down = spawn_cat(0, conn.fileno())  # the host's bytes, to the client
    waiter = threading.Thread(target=ended_down, args=(down, conn), daemon=True)
    waiter.start()
    read_end, into_cat = os.pipe()
    up = spawn_cat(read_end, 1)  # the client's bytes, to the host
    os.close(read_end)
    os.close(0)
    os.close(1)
    sent = 0
    try:
        while data:
            write_all(into_cat, data)
            sent += len(data)
            data = conn.recv(CHUNK)
    except OSError:
        pass  # the client left, or the host's side did
    os.close(into_cat)
    os.waitpid(up, 0)
    os.write(2, b"%d\n" % sent)
    waiter.join()


def ended_down(down: int, conn: socket.socket) -> None:
    """The host's bytes are over: the client hears that nothing more comes."""
    os.waitpid(down, 0)
    try:
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def spawn_cat(source: int, sink: int) -> int:
    pid = os.fork()
    if pid == 0:
        os.dup2(source, 0)
        os.dup2(sink, 1)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.execv("/bin/cat", ["cat"])
    return pid


def main() -> None:
    if sys.argv[1] == "--pipe":
        run_pipe(sys.argv[2])
        return
    port, path = int(sys.argv[1]), sys.argv[2]
    streamed = os.environ.get("SANDCELL_STREAMED") == "1"  # boundary.STREAMED_ENV
    reach = dock(path) if streamed else connector(path)
    serve(listening(port), reach)


if __name__ == "__main__":
    main()
