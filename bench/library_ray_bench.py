"""The recipe library on a Ray cluster (issue 48's targets): the library bench's mixed delivery
(five families, two sharing a layout, shuffled) cleaned with `--recipe auto` by `sandcell batch
--ray` on two nodes × 1 `sandcell` slot (ray.cluster_utils on this machine), against the same
delivery on this host with `--workers 2`, in the same run. Model requests per file (the
driver learns: one agent run per layout across the cluster, so the same as local) and jobs per
minute from the batch command's wall time (Ray's connection and node pools included); every
output must equal the truth."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.library_bench import FAMILIES, one_batch
from tests.deliveries import delivery

NODE = {"num_cpus": 1, "resources": {"sandcell": 1}, "object_store_memory": 100 << 20}
SPEED_TARGET = 0.75  # Ray's jobs per minute against local's, both on this 2-core machine


def run(smoke: bool) -> dict:
    from ray.cluster_utils import Cluster

    per_family = 2 if smoke else 12
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-library-ray-") as name:
        folder = Path(name)
        family_of = delivery(folder, dict.fromkeys(FAMILIES, per_family))
        local = one_batch(folder, "local", family_of, "auto")
        cluster = Cluster(initialize_head=True, connect=False,
                          head_node_args=dict(NODE, include_dashboard=False))  # fmt: skip
        try:
            cluster.add_node(**NODE)
            cluster.wait_for_nodes(timeout=60)
            on_ray = one_batch(folder, "ray", family_of, "auto", ("--ray", cluster.address))
        finally:
            cluster.shutdown()
    return {"local": local, "ray": on_ray,
            "speed": on_ray["jobs_per_minute"] / local["jobs_per_minute"]}  # fmt: skip


def rows(section: dict, row) -> list[str]:
    local, ray = section["local"], section["ray"]
    return [
        row(f"`batch --ray --recipe auto` ({ray['files']} files of {len(FAMILIES)} families, "
            "2 nodes × 1 slot) vs `--workers 2` here: model requests per file",
            f"{ray['requests_per_file']:.2f} vs {local['requests_per_file']:.2f} "
            f"({ray['requests']} vs {local['requests']} requests)",
            "the same as local", ray["requests"] == local["requests"]),
        row("the same deliveries: jobs per minute, Ray vs local (the batch command's wall time, "
            "replies at once; both share this machine's cores)",
            f"{section['speed']:.2f}× ({ray['jobs_per_minute']:.1f} vs "
            f"{local['jobs_per_minute']:.1f})",
            f"≥ {SPEED_TARGET:g}×", section["speed"] >= SPEED_TARGET),
    ]  # fmt: skip
