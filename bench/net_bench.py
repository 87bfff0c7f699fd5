"""What `--allow-net` adds to an HTTPS request: a fresh connection (TCP, TLS handshake, one
GET of a small CSV) from a cell through the sandbox's proxy, against the same request made
directly on the host, to the same HTTPS server on this host's loopback (tests/loopback.py's,
a test CA from trustme). The cell's
first request (the proxy's first use) and the median of the ones after, each a new
connection; over the ipc transport and the stream transport (the pipes of sandbox/net_link.py,
as a remote engine has them). `localhost` is in the sandbox's NO_PROXY: the cell drops it."""

from __future__ import annotations

import json
import ssl
import time
import urllib.request

from bench.sandbox_bench import summary
from sandcell.sandbox import DockerSandbox, Limits
from tests.loopback import file_servers

HOST = "localhost"  # in every hosts file; reached through internal: (it is loopback)

CELL = """
import json, os, ssl, time, urllib.request
os.environ.pop('NO_PROXY'), os.environ.pop('no_proxy')  # localhost: through the proxy here
open('/tmp/ca.pem', 'w').write({ca!r})
context = ssl.create_default_context(cafile='/tmp/ca.pem')
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
took = []
for _ in range({n}):
    started = time.perf_counter()
    opener.open('{url}', timeout=30).read()
    took.append(time.perf_counter() - started)
print(json.dumps(took))
"""


def direct(url: str, ca: str, n: int) -> list[float]:
    context = ssl.create_default_context(cadata=ca)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    took = []
    for _ in range(n):
        started = time.perf_counter()
        opener.open(url, timeout=30).read()
        took.append(time.perf_counter() - started)
    return took


def through_proxy(url: str, ca: str, port: int, n: int, transport: str) -> list[float]:
    limits = Limits(allow_net=(f"internal:{HOST}:{port}",), transport=transport)
    with DockerSandbox(limits=limits) as sandbox:
        ex = sandbox.run(CELL.format(ca=ca, url=url, n=n), timeout=120)
        assert ex.ok and len(ex.net) == n, ex
        return json.loads(ex.stdout)


def run(smoke: bool) -> dict:
    n = 5 if smoke else 40
    out: dict = {"requests": n}
    with file_servers(HOST) as (ports, pem):
        url = f"https://{HOST}:{ports['tls']}/x.csv"
        out["direct"] = summary(direct(url, pem, n)[1:])
        for transport in ("ipc", "stream"):
            took = through_proxy(url, pem, ports["tls"], n, transport)
            out[transport] = {"first_s": took[0], "after": summary(took[1:])}
    return out


def rows(section: dict, row) -> list[str]:
    if "skipped" in section:
        return []
    base = section["direct"]["median"]
    lines = []
    for transport in ("ipc", "stream"):
        s = section[transport]
        after = s["after"]["median"]
        lines.append(
            row(
                f"an HTTPS request (a new connection) from a cell through the --allow-net proxy "
                f"({transport} transport) vs direct on the host (median of "
                f"{section['requests'] - 1}; the cell's first)",
                f"{after * 1000:.1f} ms vs {base * 1000:.1f} ms (+{(after - base) * 1000:.1f} "
                f"ms, {after / base:.1f}x); first {s['first_s'] * 1000:.1f} ms",
                "",
                None,
            )
        )
    return lines
