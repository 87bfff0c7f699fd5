"""The sandbox image's sources: the Dockerfile, the pinned requirements and the programs that
run inside the container (supervisor, relay, kernel extension, file helper, checker).

Installed as the package data `sandcell.images` (pyproject's package-dir), which `sandcell image
build` reads (sandbox/image_build.py). Nothing imports these programs on the host: inside the
image they run from /opt/sandcell, beside sandbox/boundary.py, the contract they share."""
