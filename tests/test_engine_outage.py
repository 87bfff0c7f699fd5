"""A real engine outage (issue 21, finding 11): dockerd is stopped with SIGSTOP for a few
seconds, then continued. These stop the engine for every test beside them: the marker
`engine_outage` keeps them out of the parallel suite, and `make test` runs them alone after."""

import os
import re
import signal
import subprocess
import time
import uuid
from contextlib import contextmanager

import docker
import docker.errors
import httpx
import pytest

from sandcell.sandbox import DockerSandbox, Inputs, Limits, SandboxError, SandboxPool
from sandcell.sandbox import pool as pool_module
from sandcell.sandbox.container import DEFAULT_IMAGE as IMAGE
from sandcell.sandbox.renewable import RenewableSandbox
from tests.cli_runner import sandcell
from tests.serve_helpers import ALICE, serve_process

pytestmark = pytest.mark.docker
outage = pytest.mark.engine_outage

MAX_STOP_S = 12  # the engine is never stopped longer, whatever the test does meanwhile


def dockerd_pid() -> int:
    found = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True).stdout.split()
    if len(found) != 1 or os.getuid() != 0:
        pytest.skip("needs root and one local dockerd to stop and continue")
    return int(found[0])


@contextmanager
def engine_stopped():
    """dockerd stopped (SIGSTOP) inside the block; always continued (SIGCONT) after it, and
    by a timer after MAX_STOP_S whatever the block does."""
    pid = dockerd_pid()
    os.kill(pid, signal.SIGSTOP)
    timer = subprocess.Popen(["sh", "-c", f"sleep {MAX_STOP_S}; kill -CONT {pid}"])
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
        timer.kill()
        timer.wait()


@outage
@pytest.mark.timeout(180)
def test_after_an_outage_the_pool_s_first_acquire_works_and_keeps_one_error_only():
    with SandboxPool(size=1, limits=Limits(timeout_s=30), warmup=None) as pool:
        deadline = time.monotonic() + 120
        while pool.ready() < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        with engine_stopped():
            taken = pool.acquire()  # a ready one needs no engine; the refill begins now
            deadline = time.monotonic() + 10
            while pool.error is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert pool.error is not None  # the background start failed, and says why
            assert "no Docker engine answers" in str(pool.error)
        taken.close()
        began = time.monotonic()
        sandbox = pool.acquire(timeout=60)  # the first try, no stale error
        try:
            assert sandbox.run("print(1)").stdout == "1\n"
        finally:
            sandbox.close()
        assert time.monotonic() - began < 30


@outage
@pytest.mark.timeout(240)
def test_serve_answers_503_during_an_outage_and_serves_within_10_s_after(tmp_path):
    proc, base = serve_process(tmp_path, ["unused"], "--pool", "0", stderr=subprocess.DEVNULL)
    headers = {"Authorization": f"Bearer {ALICE}"}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=60) as api:
            with engine_stopped():
                sid = api.post("/api/sessions").json()["id"]  # no engine needed yet
                r = api.post(f"/api/sessions/{sid}/execute", json={"code": "1"})
                assert r.status_code == 503, r.text
                assert "no Docker engine answers" in r.json()["error"]
            back = time.monotonic()
            r = api.post(f"/api/sessions/{sid}/execute", json={"code": "6 * 7"})
            assert r.status_code == 200, r.text  # the same session: not pinned to the outage
            assert time.monotonic() - back < 10
            other = api.post("/api/sessions").json()["id"]
            r = api.post(f"/api/sessions/{other}/execute", json={"code": "1 + 1"})
            assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


# -- the same without stopping the engine: an image that appears late stands in for it -------


@contextmanager
def image_tag_made_later(name: str):
    """A tag of the sandbox image, missing until `make()` is called, removed after."""
    client = docker.from_env()
    repo, tag = name.split(":")
    try:
        yield lambda: client.images.get(IMAGE).tag(repo, tag)
    finally:
        try:
            client.images.remove(name)  # the tag only: the image keeps its other names
        except docker.errors.ImageNotFound:
            pass


@pytest.mark.timeout(180)
def test_background_starts_failing_keep_one_error_and_the_first_acquire_after_works():
    name = f"sandcell-sandbox:collect-late-{uuid.uuid4().hex[:8]}"
    limits = Limits(timeout_s=30)
    with (
        image_tag_made_later(name) as make,
        SandboxPool(size=2, limits=limits, image=name, warmup=None) as pool,
    ):
        deadline = time.monotonic() + 60
        while pool.error is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "is missing" in str(pool.error)
        time.sleep(pool_module.RETRY_AFTER_S + 1)  # each worker has failed again
        make()
        sandbox = pool.acquire(timeout=60)  # the first try: no stale error
        try:
            assert sandbox.run("print(1)").stdout == "1\n"
        finally:
            sandbox.close()


@pytest.mark.timeout(180)
def test_a_session_whose_sandbox_failed_to_start_is_not_live_and_starts_anew():
    name = f"sandcell-sandbox:collect-late-{uuid.uuid4().hex[:8]}"
    with image_tag_made_later(name) as make:
        renewable = RenewableSandbox(
            lambda inputs: DockerSandbox(Limits(timeout_s=30), inputs, image=name),
            Limits(timeout_s=30),
            Inputs(),
        )
        try:
            with pytest.raises(SandboxError, match="is missing"):
                renewable.run("1")
            assert not renewable.live  # it holds no --max-sessions slot
            make()
            assert renewable.run("print(2)").stdout == "2\n"  # not the stale error again
            assert renewable.live
        finally:
            renewable.close()


@outage
@pytest.mark.timeout(120)
def test_doctor_says_a_stopped_engine_does_not_answer_and_exits_3():
    """Bounded without a timed assertion: the engine comes back after MAX_STOP_S, so a doctor
    that waited for it would find it answering and exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    with engine_stopped():
        done = sandcell("doctor", env=env, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert re.search(r"^FAIL  engine +no Docker engine answers", done.stdout, re.M), done.stdout
    assert "restart it (`sudo systemctl restart docker`)" in done.stdout
    assert re.search(r"^skip  image +needs the engine", done.stdout, re.M), done.stdout
    assert "Traceback" not in done.stderr
