"""Sandbox figures: cold start, warm-pool acquire, cell round trip against raw
jupyter_client on the same kernel, many sandboxes at once, host memory under a flood of
printed text and of rich outputs."""

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from sandcell.sandbox import DockerSandbox, Limits, SandboxPool


def summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median": statistics.median(ordered), "p95": p95, "n": len(ordered)}


def cold_start(runs: int) -> dict:
    return summary([cold_start_s() for _ in range(runs)])


def cold_start_s(runtime: str | None = None) -> float:
    """Seconds from a new sandbox to its first result (its removal not counted)."""
    started = time.perf_counter()
    with DockerSandbox(runtime=runtime) as sandbox:
        assert sandbox.run("1 + 1").text == "2"
        return time.perf_counter() - started


def pool_acquire(runs: int) -> dict:
    samples = []
    with SandboxPool(size=2) as pool:
        for _ in range(runs):
            while pool.ready() < 1:  # measure a warm acquire, as a session would see it
                time.sleep(0.05)
            started = time.perf_counter()
            sandbox = pool.acquire()
            samples.append(time.perf_counter() - started)
            sandbox.close()
    return summary(samples)


def quiet(_msg: dict) -> None:
    """Take iopub messages without printing them, as sandcell does."""


def cell_round_trip(runs: int) -> dict:
    with DockerSandbox() as sandbox:
        raw_client = sandbox._client  # the same kernel, driven by plain jupyter_client
        for _ in range(20):  # warm both paths
            sandbox.run("1 + 1")
            raw_client.execute_interactive("1 + 1", timeout=10, output_hook=quiet)
        ours, raw = [], []
        for _ in range(runs):  # interleaved so machine noise hits both alike
            started = time.perf_counter()
            sandbox.run("1 + 1")
            ours.append(time.perf_counter() - started)
            started = time.perf_counter()
            raw_client.execute_interactive("1 + 1", timeout=10, output_hook=quiet)
            raw.append(time.perf_counter() - started)
    result = {"sandcell": summary(ours), "raw_jupyter_client": summary(raw)}
    result["ratio"] = result["sandcell"]["median"] / result["raw_jupyter_client"]["median"]
    return result


def concurrent_sandboxes(count: int) -> dict:
    code = "import pandas as pd\ndf = pd.DataFrame({'a': range(100000)})\nint(df.a.sum())"
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=count) as workers:
        sandboxes = list(workers.map(lambda _: DockerSandbox(), range(count)))
    try:
        with ThreadPoolExecutor(max_workers=count) as workers:
            answers = list(workers.map(lambda s: s.run(code).text, sandboxes))
        total = time.perf_counter() - started
        assert all(a == str(sum(range(100000))) for a in answers), answers
        time.sleep(1)  # let the kernels settle before reading their memory
        idle = [container_memory(s) for s in sandboxes]
    finally:
        for sandbox in sandboxes:
            sandbox.close()
    return {"count": count, "total_s": total, "idle_mb_per_sandbox": statistics.median(idle)}


def container_memory(sandbox: DockerSandbox) -> float:
    return container_mb(sandbox.container)


def container_mb(container) -> float:
    """A container's memory without the page cache, in MB."""
    memory = container.stats(stream=False).get("memory_stats", {})
    return (memory.get("usage", 0) - memory.get("stats", {}).get("cache", 0)) / 2**20


class PeakRSS:
    """This process's peak RSS growth while the block runs, sampled every 10 ms, in MB."""

    def __enter__(self) -> "PeakRSS":
        self.process = psutil.Process()
        self.before = self.peak = self.process.memory_info().rss
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()
        return self

    def _sample(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.01)

    def __exit__(self, *_exc) -> None:
        self.done.set()
        self.sampler.join()
        self.growth_mb = (self.peak - self.before) / 2**20


def flood_host_memory(gigabytes: float) -> dict:
    with DockerSandbox(limits=Limits(timeout_s=600)) as sandbox:
        chunks = int(gigabytes * 1024)
        started = time.perf_counter()
        with PeakRSS() as rss:
            ex = sandbox.run(f"line = 'x' * (1 << 20)\nfor _ in range({chunks}): print(line)")
        seconds = time.perf_counter() - started
    return {
        "gigabytes": gigabytes,
        "seconds": seconds,
        "rss_growth_mb": rss.growth_mb,
        "dropped_bytes": ex.dropped_bytes,
    }


# Rich outputs of 15 MiB each (the relay passes up to 16 MiB): by display(), which the
# kernel's cap stops, and by the display publisher's class method, which gets round that cap
# and leaves the host's to hold.
RICH_BY = {
    "display": "from IPython.display import display as send",
    "bypass": "ip = get_ipython()\ndef send(data, raw): type(ip.display_pub).publish(ip.display_pub, data)",
}


def rich_host_memory(displays: int, mib: int = 15) -> dict:
    result: dict = {"displays": displays, "mib": mib}
    with DockerSandbox(limits=Limits(timeout_s=600, memory_mb=2048)) as sandbox:
        for name, setup in RICH_BY.items():
            code = f"{setup}\nblob = 'x' * ({mib} << 20)\n"
            code += f"for _ in range({displays}): send({{'text/plain': blob}}, raw=True)"
            started = time.perf_counter()
            with PeakRSS() as rss:
                ex = sandbox.run(code)
            assert ex.ok and ex.rich_dropped == displays, (ex.error, ex.rich_dropped)
            result[name] = {
                "rss_growth_mb": rss.growth_mb,
                "seconds": time.perf_counter() - started,
            }
    result["rss_growth_mb"] = max(result[name]["rss_growth_mb"] for name in RICH_BY)
    return result


def run(smoke: bool) -> dict:
    n = 3 if smoke else 10
    return {
        "cold_start_s": cold_start(n),
        "pool_acquire_s": pool_acquire(n),
        "cell_round_trip_s": cell_round_trip(20 if smoke else 200),
        "concurrent": concurrent_sandboxes(2 if smoke else 16),
        "flood": flood_host_memory(0.05 if smoke else 1.0),
        "rich": rich_host_memory(4 if smoke else 40),
    }
