"""`sandcell doctor --ray ADDRESS`: the cluster a `serve --ray` or `batch --ray` would use: the
nodes that offer sandboxes, and on each of them its engine, the image and the runtimes, with
the fix for each miss (the same checks `doctor` runs here, run there)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import replace

from sandcell.agent.cli.doctor_checks import FAIL, OK, SKIP, Check
from sandcell.agent.cli.options import needing_ray

NODE_ANSWER_S = 120  # a node's checks (its engine may be slow to answer)


def on_the_node(runtime: str | None) -> list[Check]:
    """Run on a node: its engine, the image and the runtimes, as `doctor` checks them here."""
    from sandcell.agent.cli.doctor_checks import engine, image, runtimes

    client, found = engine()
    if client is None:
        return [found, Check("image", SKIP, "needs the engine"), Check("runtime", SKIP, "needs the engine")]  # fmt: skip
    return [found, image(client), runtimes(client.info(), runtime)]


def cluster_checks(address: str, runtime: str | None) -> Iterator[Check]:
    with needing_ray():
        import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from sandcell.sandbox.cluster import RESOURCE, no_slots, reachable
    from sandcell.sandbox.errors import SandboxUnavailable

    try:
        reachable(address)
        ray.init(
            address=address,
            namespace=f"sandcell-doctor-{uuid.uuid4().hex[:12]}",
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    except (SandboxUnavailable, ConnectionError) as error:
        yield Check("cluster", FAIL, str(error), "start one: ray start --head --resources "
                    "'{\"sandcell\": 2}', or give the head's address to --ray")  # fmt: skip
        return
    try:
        alive = [n for n in ray.nodes() if n["Alive"]]
        offering = [n for n in alive if n["Resources"].get(RESOURCE)]
        if not offering:
            yield Check("cluster", FAIL, f"{len(alive)} node(s) at {address}, none offers "
                        f"`{RESOURCE}`", no_slots(address))  # fmt: skip
            return
        slots = int(sum(n["Resources"][RESOURCE] for n in offering))
        yield Check("cluster", OK, f"{len(offering)} of {len(alive)} node(s) at {address} "
                    f"offer {slots} sandbox slot(s)")  # fmt: skip
        task = ray.remote(on_the_node)
        asked = {
            n["NodeID"]: task.options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
            ).remote(runtime)
            for n in offering
        }
        for node, ref in asked.items():
            where = f"node {node[:12]} ({next(n['NodeManagerAddress'] for n in offering if n['NodeID'] == node)})"
            try:
                found = ray.get(ref, timeout=NODE_ANSWER_S)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as error:
                first = next(iter(str(error).splitlines()), "")
                yield Check("node", FAIL, f"{where} did not answer ({first})",
                            "check `ray status` and that sandcell is installed there")  # fmt: skip
                continue
            for check in found:
                yield replace(check, detail=f"{where}: {check.detail}")
    finally:
        ray.shutdown()
