"""Output checks in a renewed sandbox (issue 25's cost): the supervisor, which has pandas and
pandera loaded from the first renewal on, forks each check from itself, for the host's own
commands only; model code can neither take its socket's name, nor be served by it, nor
change what it imports. And every output is read the way its bytes say it is written, even
where its name suggests otherwise (real Docker, real kernel)."""

import io

import pandas as pd
import pandera.pandas as pa
import pytest

from sandcell.agent.output_checks import guessed_hints, hints, load_expect, run_checks
from sandcell.sandbox import DockerSandbox, Limits, render
from tests.test_checks import PATCH

SCHEMA = pa.DataFrameSchema(
    {"id": pa.Column(int, unique=True), "name": pa.Column(str, pa.Check.isin(["ana", "zoë"]))},
    strict=True,
    coerce=True,
)
LIMITS = Limits(timeout_s=20, interrupt_grace_s=2)
GOOD = "import pandas as pd\npd.DataFrame({'id': [1, 2], 'name': ['ana', 'zoë']}).to_csv("
# Model code at the supervisor's checks socket: it cannot bind the name (PID 1 holds it from
# its start), and a request it sends is answered by nothing (closed: not the host's group).
KNOCK = """
import json, socket
took = None
try:
    socket.socket(socket.AF_UNIX).bind('\\0sandcell-checks')
    took = True
except OSError as error:
    took = error.errno
answer = b''
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect('\\0sandcell-checks')
    s.sendall(json.dumps({'outputs': [], 'max_bytes': 10}).encode())
    s.shutdown(socket.SHUT_WR)
    answer = s.recv(100) or 'nothing'
except OSError as error:  # closed on it (EPIPE, ECONNRESET), or refused (not listening)
    answer = {32: 'nothing', 104: 'nothing'}.get(error.errno, error.errno)
print(took, answer)
"""
# The socket the supervisor listens on, and every process model code can look into (its own:
# the kernel and the relay are forks of the supervisor): none holds that socket.
HOLDERS = """
import os
rows = open('/proc/net/unix').read().splitlines()[1:]
listening = {row.split()[6] for row in rows if row.endswith('@sandcell-checks')}
held = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        links = [os.readlink(f'/proc/{pid}/fd/{fd}') for fd in os.listdir(f'/proc/{pid}/fd')]
    except OSError:
        continue
    held += [pid for link in links if link.startswith('socket:[') and link[8:-1] in listening]
print(len(listening), held)
"""

# Model code connecting without end, from four processes of their own: the supervisor still
# takes the host's signals (a renewal kills them all) and still serves the host's checks.
FLOOD = """
import os, socket
for _ in range(4):
    if os.fork() == 0:
        os.setsid()
        while True:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect('\\0sandcell-checks')
                s.close()
            except OSError:
                pass
"""
PROCESSES = "import os; len([p for p in os.listdir('/proc') if p.isdigit()])"


def request(expect: dict, reads: dict | None = None) -> dict:
    items = [{"path": p, "schema": s.text, "form": s.form, "head_bytes": 64,
              "read": (reads or {}).get(p) or guessed_hints(p)} for p, s in expect.items()]  # fmt: skip
    return {"outputs": items, "max_bytes": 1 << 20}


@pytest.fixture
def expect(tmp_path):
    (tmp_path / "s.yaml").write_text(SCHEMA.to_yaml())
    return load_expect({"output/clean.csv": "s.yaml"}, tmp_path)


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_a_renewed_sandbox_checks_in_a_fork_of_the_supervisor_out_of_model_reach(expect):
    with DockerSandbox(limits=LIMITS, staging=True) as sb:
        knocked = sb.run(KNOCK)
        assert knocked.stdout == "98 111\n", render(knocked)  # EADDRINUSE, ECONNREFUSED
        assert sb.run_checks(request(expect))["checker"] == "process"
        sb.renew()
        knocked = sb.run(KNOCK)
        assert knocked.stdout == "98 nothing\n", render(knocked)  # listening now: closed on it
        holders = sb.run(HOLDERS)
        assert holders.stdout == "1 []\n", render(holders)
        assert sb.run(GOOD + "'/workspace/output/clean.csv', index=False)").ok
        answer = sb.run_checks(request(expect))
        assert answer["checker"] == "supervisor"
        assert answer["outputs"]["output/clean.csv"]["passed"] is True, answer
        # a bad output, and model code that patches pandas and pandera in its kernel and
        # plants modules everywhere it can write: the supervisor's checker imports none
        bad = "pd.DataFrame({'id': [1, 1], 'name': ['x', 'ana']}).to_csv("
        patched = sb.run(bad + "'/workspace/output/clean.csv', index=False)\n" + PATCH)
        assert patched.ok, render(patched)
        answer = sb.run_checks(request(expect))
        assert answer["checker"] == "supervisor"
        failures = answer["outputs"]["output/clean.csv"]["failures"]
        assert {f["check"] for f in failures} == {"field_uniqueness", "isin(['ana', 'zoë'])"}
        verdict = run_checks(sb, expect, 1 << 20)  # the host's whole run says the same
        assert not verdict.passed and verdict.outputs["output/clean.csv"]["failures"]


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_a_flood_of_connections_keeps_the_supervisor_from_neither_renewal_nor_checks(expect):
    with DockerSandbox(limits=LIMITS, staging=True) as sb:
        sb.renew()
        assert sb.run(FLOOD).ok
        assert sb.run(GOOD + "'/workspace/output/clean.csv', index=False)").ok
        answer = sb.run_checks(request(expect))
        assert answer["checker"] == "supervisor"
        assert answer["outputs"]["output/clean.csv"]["passed"] is True, answer
        sb.renew()
        assert sb.run(PROCESSES).text == "3"  # the supervisor, the relay, the kernel


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_an_output_not_written_as_its_name_says_is_checked_as_its_bytes_say(expect):
    with DockerSandbox(limits=LIMITS) as sb:
        # semicolons and Latin-1 in a .csv: read as its name suggests (commas, UTF-8) first,
        # which fails; its bytes say otherwise, so it is checked again, read as they say
        code = GOOD + "'/workspace/output/clean.csv', index=False, sep=';', encoding='latin-1')"
        assert sb.run(code).ok
        first = sb.run_checks(request(expect))["outputs"]["output/clean.csv"]
        assert not first["passed"]
        verdict = run_checks(sb, expect, 1 << 20)
        assert verdict.passed, verdict.outputs


FRAME = pd.DataFrame({"id": [1, 2], "name": ["ana", "zoë"]})


def written(kind: str) -> bytes:
    buffer = io.BytesIO()
    {
        "csv": lambda: FRAME.to_csv(buffer, index=False),
        "tsv": lambda: FRAME.to_csv(buffer, index=False, sep="\t"),
        "parquet": lambda: FRAME.to_parquet(buffer),
        "jsonl": lambda: FRAME.to_json(buffer, orient="records", lines=True),
        "json": lambda: FRAME.to_json(buffer),
        "xlsx": lambda: FRAME.to_excel(buffer, index=False),
    }[kind]()
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["csv", "tsv", "parquet", "jsonl", "json", "xlsx"])
def test_what_pandas_writes_by_default_is_read_as_its_name_suggests(kind):
    # the common case costs one check run: the guess from the name is what the bytes say
    path = f"output/clean.{kind}"
    assert hints(path, written(kind), complete=True) == guessed_hints(path)


def test_a_file_written_otherwise_is_not_read_as_its_name_suggests():
    data = FRAME.to_csv(index=False, sep=";").encode("latin-1")
    said = hints("output/clean.csv", data, complete=True)
    assert said != guessed_hints("output/clean.csv")
    assert said["delimiter"] == ";" and said["encoding"] != "utf-8"
