"""The running Docker engine reached over TCP on loopback, as a remote engine would be
(`DOCKER_HOST=tcp://127.0.0.1:PORT`): a forwarder from a loopback port to the engine's Unix
socket. The engine is never restarted for this (a restart would end every container of the
parallel suite). Run as `python -m tests.tcp_engine`: it prints its port, then forwards until
its stdin closes (the test process that started it has gone)."""

import os
import socket
import sys
import threading

ENGINE_SOCKET = "/var/run/docker.sock"


def pipe(source: socket.socket, target: socket.socket) -> None:
    """Copy one direction; at its end, half-close the other side (an exec's stdin ends so)."""
    try:
        while data := source.recv(1 << 16):
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(client: socket.socket) -> None:
    engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        engine.connect(os.environ.get("SANDCELL_ENGINE_SOCKET", ENGINE_SOCKET))
    except OSError:
        client.close()
        return
    back = threading.Thread(target=pipe, args=(engine, client), daemon=True)
    back.start()
    pipe(client, engine)
    back.join()
    client.close()
    engine.close()


def main() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve, args=(client,), daemon=True).start()


if __name__ == "__main__":
    main()
