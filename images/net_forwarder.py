"""Inside the container: the loopback port that HTTP_PROXY and HTTPS_PROXY name when the
sandbox has an allowlist (`--allow-net`). The container has no network interface; each
connection accepted here is carried, byte for byte, over the Unix socket the host put in
the container (boundary.NET_SOCKET) to the host's proxy for this sandbox, which decides.

Nothing is decided here: a connection the host refuses gets the host's answer. At most
MOST connections are carried at once; more are closed at once (the host caps them lower)."""

import socket
import sys
import threading

MOST = 16
CHUNK = 64 << 10


def carry(client: socket.socket, host_socket: str, slots: threading.Semaphore) -> None:
    """One connection: to the host's proxy, then both ways until either side ends."""
    try:
        with client, socket.socket(socket.AF_UNIX) as host:
            host.connect(host_socket)
            back = threading.Thread(target=pipe, args=(host, client), daemon=True)
            back.start()
            pipe(client, host)
            back.join()
    except OSError:
        pass  # the host's proxy is gone (the sandbox is closing) or the client left
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


def serve(listener: socket.socket, host_socket: str, stop: threading.Event | None = None) -> None:
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
        threading.Thread(target=carry, args=(client, host_socket, slots), daemon=True).start()


def listening(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(MOST)
    return listener


def main() -> None:
    port, host_socket = int(sys.argv[1]), sys.argv[2]
    serve(listening(port), host_socket)


if __name__ == "__main__":
    main()
