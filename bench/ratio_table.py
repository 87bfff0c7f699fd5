"""The report: a table of medians and ratios with the targets beside them."""

import importlib

# beside the sandbox's: each in bench/<name>_bench.py
SECTIONS = (
    "agent",
    "batch",
    "recipe",
    "library",
    "library_ray",
    "packages",
    "session",
    "serve",
    "serve_ray",
    "mcp",
    "ray",
    "gvisor",
    "transport",
    "pause",
    "realmodel",
    "checks",
    "net",
)


def sections():
    for name in SECTIONS:
        yield name, importlib.import_module(f"bench.{name}_bench")


def _row(what: str, figure: str, target: str, met: bool | None) -> str:
    verdict = "" if met is None else ("met" if met else "**missed**")
    return f"| {what} | {figure} | {target} | {verdict} |"


def _rich_row(rich: dict) -> str:
    return _row(
        f"host RSS growth during {rich['displays']} displays of {rich['mib']} MiB "
        "(display() / kernel cap bypassed)",
        f"{rich['display']['rss_growth_mb']:.1f} MB / {rich['bypass']['rss_growth_mb']:.1f} MB "
        f"({rich['display']['seconds']:.1f} s / {rich['bypass']['seconds']:.1f} s)",
        "≤ 64 MB",
        rich["rss_growth_mb"] <= 64,
    )


def markdown(r: dict) -> str:
    s = r["sandbox"]
    rows = [
        _row(
            "cold start, container to first result (median / p95)",
            f"{s['cold_start_s']['median']:.2f} s / {s['cold_start_s']['p95']:.2f} s",
            "≤ 1.0 s median",
            s["cold_start_s"]["median"] <= 1.0,
        ),
        _row(
            "warm pool acquire (median)",
            f"{s['pool_acquire_s']['median'] * 1000:.2f} ms",
            "≤ 30 ms",
            s["pool_acquire_s"]["median"] <= 0.030,
        ),
        _row(
            "trivial cell, DockerSandbox.run vs raw jupyter_client (median ratio)",
            f"{s['cell_round_trip_s']['ratio']:.2f}× "
            f"({s['cell_round_trip_s']['sandcell']['median'] * 1000:.1f} ms vs "
            f"{s['cell_round_trip_s']['raw_jupyter_client']['median'] * 1000:.1f} ms)",
            "≤ 1.3×",
            s["cell_round_trip_s"]["ratio"] <= 1.3,
        ),
        _row(
            f"{s['concurrent']['count']} sandboxes at once, each a pandas cell (total)",
            f"{s['concurrent']['total_s']:.1f} s",
            "",
            None,
        ),
        _row(
            "memory per idle sandbox (container, median)",
            f"{s['concurrent']['idle_mb_per_sandbox']:.0f} MB",
            "",
            None,
        ),
        _row(
            f"host RSS growth during a {s['flood']['gigabytes']:g} GB print",
            f"{s['flood']['rss_growth_mb']:.1f} MB ({s['flood']['seconds']:.1f} s)",
            "≤ 64 MB",
            s["flood"]["rss_growth_mb"] <= 64,
        ),
        _rich_row(s["rich"]) if "rich" in s else _row("rich-output RSS", "not run", "", None),
    ]
    details = []
    for name, module in sections():
        if name in r:
            rows += module.rows(r[name], _row)
            if hasattr(module, "details"):  # optional: the numbers behind a row
                details.append(module.details(r[name]))
    m = r["machine"]
    head = (
        f"# sandcell benchmarks{' (smoke run: few repetitions)' if r.get('smoke') else ''}\n\n"
        f"Machine: {m['cpus']} CPUs, {m['memory_gb']} GB, Docker {m['docker']}, "
        f"Python {m['python']}; sandcell {m['sandcell']}. Run took {r.get('seconds', 0)} s.\n\n"
        "| what | figure | target | |\n|---|---|---|---|\n"
    )
    return head + "\n".join(rows) + "\n" + "".join("\n" + d for d in details)
