"""The operator's wheelhouse (issue 39): `sandcell packages add/list/remove` on a real pip
(no index asked: the wheels are made here), its index with hashes, refusals that leave it
unchanged; then in real sandboxes under runc and runsc: `%pip install` and `!pip install`
from it, an absent package said at once with the closest names, no network, a read-only
mount, nothing the checker or a renewed sandbox sees, a tampered wheel refused, and a
wheelhouse made for another Python not mounted."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

import pytest

from sandcell.sandbox import DockerSandbox, Limits, render
from sandcell.sandbox import container as ctr
from sandcell.sandbox.boundary import PACKAGES_DIR, WHEELHOUSE
from sandcell.sandbox.wheelhouse import Wheelhouse, WheelhouseError, add, offer, remove
from tests.cli_runner import sandcell
from tests.scripted_server import ScriptedServer
from tests.wheels import make_wheel

pytestmark = pytest.mark.timeout(240)

FUZZ_CODE = "import numpy\nVALUE = 42\nNUMPY = numpy.__file__\n"


@pytest.fixture
def no_index(monkeypatch):
    """pip asks no index (tests never reach PyPI): only local wheels and the cache."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


# -- the wheelhouse on the host (no Docker) -----------------------------------------------


def test_add_indexes_each_wheel_with_its_sha256(tmp_path, no_index):
    wheel = make_wheel(tmp_path, "tinyclean", "0.3")
    house = Wheelhouse(tmp_path / "wh")
    said = add(house, [], [], [wheel], "3.11")
    assert said.wheels == [wheel.name]
    assert house.python == "3.11" and house.packages() == {"tinyclean": ["0.3"]}
    page = (house.path / "simple" / "tinyclean" / "index.html").read_text()
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert f'href="../../wheels/{wheel.name}#sha256={digest}"' in page
    assert "tinyclean/" in (house.path / "simple" / "index.html").read_text()
    for path in house.path.rglob("*"):  # readable by the sandbox's uid
        assert path.stat().st_mode & 0o777 == (0o755 if path.is_dir() else 0o644)
    assert house.stray_files() == []


def test_a_conflicting_pin_is_refused_and_the_wheelhouse_is_unchanged(tmp_path, no_index):
    house = Wheelhouse(tmp_path / "wh")
    add(house, [], [], [make_wheel(tmp_path, "tinyclean")], "3.11")
    before = snapshot(house.path)
    # numpy 1.0 is there to be had (a local wheel): only the image's pin refuses it
    clash = make_wheel(tmp_path, "oldnumpyuser", requires=("numpy==1.0",))
    old_numpy = make_wheel(tmp_path, "numpy", "1.0")
    with pytest.raises(WheelhouseError) as refused:
        add(house, [], [], [clash, old_numpy], "3.11")
    said = str(refused.value)
    assert "conflicts with a package the image pins" in said and "numpy" in said, said
    assert "wheelhouse is unchanged" in said
    assert snapshot(house.path) == before
    assert not list(tmp_path.glob(".wh-staging-*"))  # the staging folder is gone too


def test_another_python_is_refused_into_the_same_wheelhouse(tmp_path, no_index):
    house = Wheelhouse(tmp_path / "wh")
    add(house, [], [], [make_wheel(tmp_path, "tinyclean")], "3.11")
    with pytest.raises(WheelhouseError, match="is for Python 3.11, not 3.12"):
        add(house, [], [], [make_wheel(tmp_path, "other")], "3.12")


def test_a_wheel_of_the_same_name_with_other_bytes_is_refused(tmp_path, no_index):
    house = Wheelhouse(tmp_path / "wh")
    add(house, [], [], [make_wheel(tmp_path, "tinyclean")], "3.11")
    assert add(house, [], [], [make_wheel(tmp_path, "tinyclean")], "3.11").already
    before = snapshot(house.path)
    (tmp_path / "other").mkdir()
    other = make_wheel(tmp_path / "other", "tinyclean", code="X = 2\n")
    with pytest.raises(WheelhouseError, match="already with other bytes"):
        add(house, [], [], [other], "3.11")
    assert snapshot(house.path) == before
    with pytest.raises(WheelhouseError, match="not a Python version"):
        add(house, [], [], [other], "3.11; rm -rf /")


def test_remove_and_close_names(tmp_path, no_index):
    house = Wheelhouse(tmp_path / "wh")
    add(
        house, [], [], [make_wheel(tmp_path, "tinyclean"), make_wheel(tmp_path, "tinyfuzz")], "3.11"
    )
    with pytest.raises(WheelhouseError, match=r"closest: tinyfuzz"):
        remove(house, "tinyfuz")
    assert remove(house, "TinyFuzz") == ["tinyfuzz-1.0-py3-none-any.whl"]
    assert list(house.packages()) == ["tinyclean"]
    assert not (house.path / "simple" / "tinyfuzz").exists()


def test_offer_mounts_only_a_clean_wheelhouse_made_for_the_image(tmp_path, no_index):
    house = Wheelhouse(tmp_path / "wh")
    add(house, [], [], [make_wheel(tmp_path, "tinyclean")], "3.11")
    assert offer(house.path, "3.11", "x86_64").mount == house.path.resolve()
    other = offer(house.path, "3.12", "x86_64")
    assert other.mount is None and "made for Python 3.11" in other.refused
    for name in ("notes.txt", "simple/notes.txt", "wheels/notawheel.whl", "simple/gone/index.html"):
        (house.path / name).parent.mkdir(exist_ok=True)
        (house.path / name).write_text("a secret the sandbox must not see")
        stray = offer(house.path, "3.11", "x86_64")
        assert stray.mount is None and name.split("/")[-1] in stray.refused, name
        (house.path / name).unlink()
    (house.path / "simple" / "gone").rmdir()
    (house.path / "wheels" / "x.whl").symlink_to("/etc/hostname")
    assert offer(house.path, "3.11", "x86_64").mount is None
    (house.path / "wheels" / "x.whl").unlink()
    assert offer(house.path, "3.11", "x86_64").mount is not None
    assert offer(tmp_path / "nowhere", "3.11", "x86_64").refused


def test_packages_cli_add_list_remove_and_usage(tmp_path, no_index):
    wheel = make_wheel(tmp_path, "tinyclean", "0.3")
    folder = str(tmp_path / "wh")
    added = sandcell("packages", "add", "--wheelhouse", folder, "--python", "3.11", str(wheel))
    assert added.returncode == 0, added.stderr
    assert "+ tinyclean-0.3-py3-none-any.whl" in added.stdout
    listed = sandcell("packages", "list", "--wheelhouse", folder)
    assert "tinyclean 0.3" in listed.stdout and "Python 3.11" in listed.stdout
    assert sandcell("packages", "add", "--wheelhouse", folder).returncode == 2
    gone = sandcell("packages", "remove", "--wheelhouse", folder, "nothere")
    assert gone.returncode == 1 and "Traceback" not in gone.stderr
    assert sandcell("packages", "remove", "--wheelhouse", folder, "tinyclean").returncode == 0
    bad = sandcell("exec", "--wheelhouse", str(tmp_path), "-c", "1")
    assert bad.returncode == 2 and "not a wheelhouse" in bad.stderr


def test_the_prompt_names_the_packages_capped():
    from sandcell.agent.prompts import packages_note
    from sandcell.sandbox.wheelhouse import Offer

    names = tuple(f"pkg{i:03}" for i in range(50))
    note = packages_note(Offer(mount=Path("/x"), packages=names), cap=40)
    assert "pkg039" in note and "pkg040" not in note and "and 10 more" in note
    assert "pandas" in note and "%pip install" in note
    refused = packages_note(Offer(refused="made for Python 3.12"))
    assert "No other package can be installed: made for Python 3.12" in refused
    assert packages_note(Offer()) == ""


# -- in real sandboxes -------------------------------------------------------------------


@pytest.fixture(scope="module")
def house(tmp_path_factory) -> Path:
    """A wheelhouse of tinyfuzz (needs numpy: the image's is used) and tinyclean, made with
    `sandcell packages add` from local wheels, no index asked."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    fuzz = make_wheel(folder, "tinyfuzz", "1.0", FUZZ_CODE, requires=("numpy>=1",))
    clean = make_wheel(folder, "tinyclean", "0.3")
    made = sandcell(
        "packages", "add", "--wheelhouse", str(folder / "wh"), str(fuzz), str(clean),
        env={**os.environ, "PIP_NO_INDEX": "1"},
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "not kept, the image has them: numpy==" in made.stdout
    return folder / "wh"


def ran(sandbox, code: str):
    ex = sandbox.run(code)
    return ex, "".join(c.text for c in ex.stream)


@pytest.mark.docker
def test_pip_install_from_the_wheelhouse_and_what_it_cannot_do(house, runtime):
    limits = Limits(timeout_s=120, runtime=runtime, wheelhouse=str(house))
    with DockerSandbox(limits, staging=True) as sandbox:
        assert sandbox.wheelhouse.mount == house.resolve()
        ex, out = ran(
            sandbox, "%pip install tinyfuzz\nimport tinyfuzz\nprint(tinyfuzz.VALUE, tinyfuzz.NUMPY)"
        )
        assert ex.error is None, ex.error
        assert "42 /opt/venv/lib/python3.11/site-packages/numpy/" in out  # the image's numpy
        assert "restart the kernel" not in out
        ex, out = ran(sandbox, "!pip install tinyclean\nimport tinyclean\nprint(tinyclean.VERSION)")
        assert ex.error is None and out.rstrip().endswith("0.3"), out
        ex, out = ran(
            sandbox,
            f"import os\nprint(sorted(os.listdir('{PACKAGES_DIR}/lib/python3.11/site-packages')))",
        )
        assert "numpy" not in out and "tinyfuzz" in out  # no second numpy
        started = time.monotonic()
        ex = sandbox.run("%pip install tinyfuz")
        took = time.monotonic() - started
        assert ex.error is not None and ex.error.name == "PackageNotOffered"
        assert "not available offline" in ex.error.value and "tinyfuzz" in ex.error.value
        shown = render(ex)  # one line, no frames of the kernel's extension
        assert shown.splitlines()[0].startswith("PackageNotOffered: tinyfuz: not available"), shown
        assert "Traceback" not in shown and "sandcell_pip" not in shown
        assert took < 20, (
            took
        )  # checked before pip starts (the issue asks within 2 s; generous here)
        ex, out = ran(sandbox, "import os\nprint(sorted(os.listdir('/sys/class/net')))")
        assert out.strip() == "['lo']"
        ex, out = ran(sandbox, f"open('{WHEELHOUSE}/x', 'w')")
        assert ex.error is not None and ex.error.name in ("OSError", "PermissionError")
        assert "Read-only" in ex.error.value or "denied" in ex.error.value
        # the checker's Python (-I) and every process not started by the kernel see none of it
        code, out_, err = ctr.exec_in(sandbox.container, ["python", "-I", "-c", "import tinyfuzz"])
        assert code != 0 and b"No module named 'tinyfuzz'" in err
        sandbox.renew()
        ex = sandbox.run("import tinyfuzz")
        assert ex.error is not None and ex.error.name == "ModuleNotFoundError"
        ex, out = ran(
            sandbox, f"import os\nprint(os.listdir('{PACKAGES_DIR}/lib/python3.11/site-packages'))"
        )
        assert out.strip() == "[]"


@pytest.mark.docker
def test_a_tampered_wheel_is_refused_by_pip(house, tmp_path, runtime):
    copy = tmp_path / "wh"
    shutil.copytree(house, copy)
    wheel = next((copy / "wheels").glob("tinyclean-*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")  # the index's hash no longer holds
    with DockerSandbox(Limits(timeout_s=120, runtime=runtime, wheelhouse=str(copy))) as sandbox:
        ex, out = ran(sandbox, "%pip install tinyclean")
        assert ex.error is not None and ex.error.name == "PackageInstallError"
        assert "DO NOT MATCH THE HASHES" in out
        assert sandbox.run("import tinyclean").error.name == "ModuleNotFoundError"


@pytest.mark.docker
def test_a_wheelhouse_for_another_python_is_not_mounted(tmp_path, runtime, no_index):
    other = Wheelhouse(tmp_path / "wh312")
    add(other, [], [], [make_wheel(tmp_path, "tinyclean")], "3.12")
    with DockerSandbox(Limits(runtime=runtime, wheelhouse=str(other.path))) as sandbox:
        assert sandbox.wheelhouse.mount is None
        assert re.search(
            r"made for Python 3\.12 .* the image has Python 3\.11", sandbox.wheelhouse.refused
        )
        ex, out = ran(sandbox, f"import os\nprint(os.path.exists('{WHEELHOUSE}'))")
        assert out.strip() == "False"
        ex = sandbox.run("%pip install tinyclean")
        assert ex.error is not None and "no wheelhouse is mounted" in ex.error.value


# -- recipes, serve, doctor ------------------------------------------------------------------

CLEAN = (
    "import pandas as pd, tinyclean\n"
    "df = pd.read_csv('/data/{name}').drop_duplicates()\n"
    "df = df[(df.amount >= 0) & df.region.isin(['N', 'S'])]\n"
    "import os; os.makedirs('/workspace/output', exist_ok=True)\n"
    "df.to_csv('/workspace/output/clean.csv', index=False)\n"
)


def _jobs(folder: Path, name: str) -> str:
    job = {"id": name.split(".")[0], "task": f"Clean {name} into output/clean.csv",
           "inputs": [name], "expect": {"output/clean.csv": "sales.yaml"}}  # fmt: skip
    (folder / "jobs.jsonl").write_text(json.dumps(job) + "\n")
    return "jobs.jsonl"


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_recipe_records_its_packages_and_a_job_installs_them_first(house, tmp_path):
    from tests.deliveries import SALES
    from tests.deliveries import python as call

    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_text("id,amount,region\n1,10.5,N\n2,-3,S\n2,-3,S\n3,4,N\n")
    (tmp_path / "sales.yaml").write_text(SALES.to_yaml())
    args = ["--api-key", "k", "--model", "m", "--protocol", "tools"]
    script = [
        call("%pip install tinyclean"),
        call(CLEAN.format(name="a.csv")),
        "Final Answer: done.",
    ]
    with ScriptedServer(script) as server:
        run = sandcell(
            "run", "--task", "Clean a.csv", "--input", "a.csv", "--output", "run",
            "--expect", "output/clean.csv=sales.yaml", "--wheelhouse", str(house),
            "--base-url", server.url, *args, cwd=tmp_path, timeout=280,
        )  # fmt: skip
        system = server.requests[0]["messages"][0]["content"]
    assert run.returncode == 0, run.stderr
    assert "`%pip install NAME`" in system and "tinyclean, tinyfuzz" in system  # the prompt
    assert sandcell("recipe", "run", "-o", "recipe.py", cwd=tmp_path).returncode == 0
    assert '# packages: ["tinyclean"]' in (tmp_path / "recipe.py").read_text()

    # the recipe alone solves b, on a renewed sandbox with the wheelhouse: no model request
    with ScriptedServer([]) as server:
        done = sandcell(
            "batch", _jobs(tmp_path, "b.csv"), "--output", "out1", "--no-progress",
            "--recipe", "recipe.py", "--wheelhouse", str(house), "--base-url", server.url,
            *args, cwd=tmp_path, timeout=280,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    line = json.loads((tmp_path / "out1" / "results.jsonl").read_text())
    assert line["solved_by"] == "recipe" and not server.requests

    # without the wheelhouse the recipe cannot run: the agent is told why (the machine, the
    # package) and answers without it
    fix = CLEAN.format(name="b.csv").replace(", tinyclean", "")
    with ScriptedServer([call(fix), "Final Answer: done without it."]) as server:
        done = sandcell(
            "batch", _jobs(tmp_path, "b.csv"), "--output", "out2", "--no-progress",
            "--recipe", "recipe.py", "--wheelhouse", "none", "--base-url", server.url,
            *args, cwd=tmp_path, timeout=280,
        )  # fmt: skip
        told = next(m["content"] for m in server.requests[0]["messages"] if m["role"] == "user")
    assert done.returncode == 0, done.stdout + done.stderr
    line = json.loads((tmp_path / "out2" / "results.jsonl").read_text())
    assert line["solved_by"] == "agent" and line["recipe_failure"] == {
        "cell": None,
        "error": "packages",
    }
    assert f"could not be installed on {socket.gethostname()}" in told and "tinyclean" in told
    assert "PackageNotOffered" in told


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_served_session_rebuilt_after_a_restart_installs_its_packages_again(house, tmp_path):
    from tests.serve_helpers import client, config, execute, new_session, serving

    with ScriptedServer() as model:
        cfg = config(model, tmp_path / "d", limits=Limits(timeout_s=120, wheelhouse=str(house)))
        with serving(cfg) as base, client(base) as api:
            sid = new_session(api)
            assert execute(api, sid, "%pip install tinyfuzz").json()["error"] is None
        with serving(cfg) as base, client(base) as api:
            r = execute(api, sid, "import tinyfuzz\ntinyfuzz.VALUE")
            assert r.json()["error"] is None, r.json()
            assert "re-running its 1 recorded cell(s)" in r.headers["x-sandcell-warning"]
            shown = [x["data"]["text/plain"] for x in r.json()["results"] if x["is_main"]]
            assert shown == ["42"]


@pytest.mark.docker
def test_doctor_says_when_the_wheelhouse_does_not_fit_the_image(tmp_path, no_index):
    other = Wheelhouse(tmp_path / "wh312")
    add(other, [], [], [make_wheel(tmp_path, "tinyclean")], "3.12")
    env = {**os.environ, "SANDCELL_WHEELHOUSE": str(other.path)}
    said = sandcell("doctor", env=env, timeout=120).stdout
    line = next(x for x in said.splitlines() if "packages" in x)
    assert line.startswith("warn") and "made for Python 3.12" in line and "not mounted" in line


def test_pip_install_lines_as_the_kernel_and_a_recipe_read_them():
    from sandcell.sandbox.boundary import pip_install_requirements as asked
    from sandcell.sandbox.boundary import requirement_name

    assert asked("/opt/venv/bin/python -m pip install rapidfuzz") == ["rapidfuzz"]
    assert asked("pip install -q 'a>=1' b[x]==2 -r r.txt -i URL ./x.whl c && ls") == [
        "a>=1",
        "b[x]==2",
        "c",
    ]
    assert asked("ls && pip3 install Rapid_Fuzz") == ["Rapid_Fuzz"]
    assert requirement_name("Rapid_Fuzz>=1") == "rapid-fuzz"
    assert asked("echo pip install x") is None and asked("pip --version") is None
    assert asked("pip install 'unclosed") is None


@pytest.mark.docker
def test_the_default_wheelhouse_is_used_unless_none(house):
    env = {**os.environ, "SANDCELL_WHEELHOUSE": str(house)}
    code = "%pip install -q tinyclean\nimport tinyclean\nprint(tinyclean.VERSION)"
    used = sandcell("exec", "-c", code, env=env, timeout=180)
    assert used.returncode == 0 and used.stdout.strip().endswith("0.3"), used.stdout + used.stderr
    off = sandcell("exec", "--wheelhouse", "none", "-c", code, env=env, timeout=180)
    assert off.returncode == 1 and "no wheelhouse is mounted" in off.stdout + off.stderr
