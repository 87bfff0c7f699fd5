"""`sandcell doctor` and `sandcell image` against the real engine: what holds, what is missing
and how to fix it, and exit 0 or 3. The engine-outage case lives in test_engine_outage.py."""

import os
import re

import pytest

from sandcell.sandbox import image_build
from tests.cli_runner import sandcell
from tests.scripted_server import ScriptedServer, dead_url

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


def doctor(*args: str, **env: str):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SANDCELL_M"))}
    return sandcell("doctor", *args, env={**clean, **env}, timeout=60)


def lines(output: str) -> dict[str, str]:
    """Each check's status by name, from doctor's screen."""
    found = re.findall(r"^\s*(ok|warn|FAIL|skip)\s+(\w+)\s", output, re.M)
    return {name: status for status, name in found}


def test_everything_there_exits_0_and_names_each_check():
    with ScriptedServer(model="scripted-model") as server:
        done = doctor(OPENAI_BASE_URL=server.url, SANDCELL_MODEL="scripted-model")
    assert done.returncode == 0, done.stdout + done.stderr
    checks = lines(done.stdout)
    assert set(checks) == {
        "engine",
        "image",
        "packages",
        "runtime",
        "transport",
        "pausing",
        "cgroups",
        "network",
        "model",
        "disk",
    }
    assert checks["engine"] == checks["image"] == checks["model"] == "ok", done.stdout
    assert "serves scripted-model" in done.stdout
    assert "everything a run needs is here" in done.stdout
    assert (
        "ipc: the engine at unix:///var/run/docker.sock sees this machine's folders" in done.stdout
    )


def test_the_allowlist_in_force_is_shown_and_a_wrong_one_fails_with_its_fix():
    with ScriptedServer(model="scripted-model") as server:
        env = {"OPENAI_BASE_URL": server.url, "SANDCELL_MODEL": "scripted-model"}
        done = doctor(**env, SANDCELL_ALLOW_NET="data.example.org internal:intra.lan:8080")
        wrong = doctor(**env, SANDCELL_ALLOW_NET="data.example.org:99999")
    assert done.returncode == 0 and lines(done.stdout)["network"] == "ok", done.stdout
    assert (
        "named hosts only, through a proxy on this host: data.example.org, internal:intra.lan:8080"
        in done.stdout
    )
    assert wrong.returncode == 3 and lines(wrong.stdout)["network"] == "FAIL", wrong.stdout
    assert "'99999' is not a number from 1 to 65535" in wrong.stdout


def test_a_missing_image_tag_exits_3_and_says_to_build_it():
    done = doctor(SANDCELL_IMAGE="sandcell-sandbox:no-such-tag")
    assert done.returncode == 3, done.stdout + done.stderr
    assert lines(done.stdout)["image"] == "FAIL"
    assert "sandcell-sandbox:no-such-tag is missing" in done.stdout
    assert "fix: sandcell image build" in done.stdout
    assert "1 problem(s)" in done.stdout and "Traceback" not in done.stderr
    shown = sandcell("image", env={**os.environ, "SANDCELL_IMAGE": "sandcell-sandbox:no-such-tag"})
    assert shown.returncode == 3 and "missing" in shown.stdout


def test_an_endpoint_that_does_not_answer_or_refuses_the_key_fails_the_model_check():
    done = doctor(OPENAI_BASE_URL=dead_url())
    assert done.returncode == 3 and lines(done.stdout)["model"] == "FAIL", done.stdout
    given = doctor("--base-url", dead_url())  # a flag configures it as the variable does
    assert given.returncode == 3 and lines(given.stdout)["model"] == "FAIL", given.stdout
    assert "fix: start the server" in done.stdout
    with ScriptedServer(api_key="right") as server:
        done = doctor(OPENAI_BASE_URL=server.url, OPENAI_API_KEY="wrong")
    assert done.returncode == 3 and "refused the key" in done.stdout, done.stdout
    with ScriptedServer(model="other") as server:  # answers, but not with that model: a warning
        done = doctor(OPENAI_BASE_URL=server.url, SANDCELL_MODEL="mine")
    assert done.returncode == 0 and lines(done.stdout)["model"] == "warn", done.stdout
    assert "does not list mine (it has: other)" in done.stdout


def test_a_runtime_the_engine_lacks_fails_with_how_to_register_it():
    done = doctor("--runtime", "no-such-runtime")
    assert done.returncode == 3 and lines(done.stdout)["runtime"] == "FAIL", done.stdout
    assert "daemon.json" in done.stdout


def test_version_and_image_name_the_same_sources_hash(image):
    version = sandcell("--version")
    assert version.returncode == 0
    expected = image_build.sources_hash()
    assert re.fullmatch(rf"sandcell \S+ \(sandbox image sources {expected}\)\n", version.stdout)
    shown = sandcell("image")
    assert shown.returncode == 0 and f"current (sources {expected}" in shown.stdout, shown.stdout


def test_image_build_keeps_a_current_image_and_checks_it_starts_under_the_runtime(image):
    done = sandcell("image", "build", "--runtime", "runsc", timeout=120)
    if "no runtime 'runsc'" in done.stderr:
        pytest.skip("the engine has no runsc runtime")
    assert done.returncode == 0 and "is up to date" in done.stdout, done.stdout + done.stderr
    missing = sandcell("image", "build", "--runtime", "no-such-runtime")
    assert missing.returncode == 3 and "no runtime 'no-such-runtime'" in missing.stderr
    assert "sandcell doctor" in missing.stderr


def test_doctor_says_which_transport_a_remote_engine_takes_and_refuses_ipc_there(tcp_engine):
    """The same engine over TCP, as a remote one is: auto takes stream and says why; ipc,
    which needs the engine to see this machine's folders, fails the check with what to use."""
    done = doctor(DOCKER_HOST=tcp_engine)
    assert lines(done.stdout)["transport"] == "ok", done.stdout
    assert f"stream: the engine is remote ({tcp_engine})" in done.stdout
    refused = doctor("--transport", "ipc", DOCKER_HOST=tcp_engine)
    assert refused.returncode == 3 and lines(refused.stdout)["transport"] == "FAIL", refused.stdout
    assert "use --transport stream (or auto)" in refused.stdout
