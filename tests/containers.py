"""Which sandcell containers exist, read race-free for tests that run side by side."""

import docker

from sandcell.sandbox.container import OWNER_LABEL, owner


def container_labels(*labels: str, running_only: bool = False) -> list[dict]:
    """Labels of each container carrying every given label (``key`` or ``key=value``).

    The plain list call: docker's containers.list() inspects each container afterwards and
    fails with NotFound when another test (or a closing sandbox) removes one in between.
    """
    entries = docker.from_env().api.containers(
        all=not running_only, filters={"label": list(labels)}
    )
    return [entry.get("Labels") or {} for entry in entries]


def owner_label(pid: int) -> str:
    """The label filter for the containers a process on this host started."""
    return f"{OWNER_LABEL}={owner(pid)}"
