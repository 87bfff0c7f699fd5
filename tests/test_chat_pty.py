"""`sandcell chat` driven through a pseudo-terminal: two questions sharing kernel state,
Ctrl-C interrupting a running cell without ending the session, slash commands, and a second
Ctrl-C ending the session cleanly."""

import io
import json
import re
import signal
import time

import pexpect
import pytest

from tests.cli_runner import sandcell_terminal
from tests.containers import container_labels, owner_label
from tests.serve_helpers import python


def step(thought: str, code: str) -> dict:
    """A reply that thinks aloud, then runs code."""
    return {"content": f"Thought: {thought}", **python(code)}


def slow(rounds: int) -> str:
    """Code that takes rounds / 5 seconds."""
    return f"import time\nfor i in range({rounds}):\n    time.sleep(0.2)"


SCRIPT = [
    step(
        "sum the column.",
        "import pandas as pd\ndf = pd.read_csv('/data/numbers.csv')\n"
        "total = int(df.n.sum())\nprint('total', total)",
    ),
    {"content": "Final Answer: the total is 6."},
    step("reuse the total from before.", "print('doubled', total * 2)"),
    {"content": "Final Answer: doubled, it is 12."},
    step("a slow computation.", slow(600)),
    {"content": "Final Answer: the computation was interrupted."},
    step("state survived the interrupt.", "print('still', total)"),
    {"content": "Final Answer: still 6."},
    step("slow again.", slow(600)),
    step("and once more.", slow(601)),
]


@pytest.mark.docker
@pytest.mark.timeout(240)
@pytest.mark.xdist_group("chat")
def test_chat_two_questions_share_state_and_ctrl_c_interrupts_the_cell(tmp_path):
    (tmp_path / "numbers.csv").write_text("n\n1\n2\n3\n")
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    folder = tmp_path / "session"
    args = ["chat", "--input", str(tmp_path / "numbers.csv"), "--output", str(folder)]
    args += ["--replay", str(tmp_path / "script.json"), "--timeout", "120"]
    child = sandcell_terminal(
        *args,
        env={"PATH": "/usr/bin:/bin", "TERM": "dumb", "COLUMNS": "120", "HOME": str(tmp_path)},
        encoding="utf-8",
        timeout=120,
        cwd=str(tmp_path),
        # Started as a script's background job would be: SIGINT ignored, inherited. Ctrl-C
        # must still work, so chat has to restore the handler itself.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    child.str_last_chars = 4000  # a failure shows what the chat printed, not 100 characters
    child.logfile_read = (tmp_path / "transcript.txt").open("w")
    owner = owner_label(child.pid)
    try:
        child.expect("you> ")
        # the session's sandbox starts in the background while the prompt is already shown
        deadline = time.monotonic() + 60
        while not container_labels(owner, running_only=True) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(container_labels(owner, running_only=True)) == 1
        child.sendline("What is the total of n?")
        child.expect("total 6")
        child.expect("the total is 6")
        child.expect("you> ")
        child.sendline("Double it.")
        child.expect("doubled 12")  # the kernel kept `total` between questions
        child.expect("you> ")
        child.sendline("Now something slow.")
        child.expect("time.sleep")
        time.sleep(2)  # the cell is running now
        child.sendintr()
        child.expect("interrupted the running cell")
        child.expect("KeyboardInterrupt")
        child.expect("the computation was interrupted")
        child.expect("you> ")  # the session goes on
        child.sendline("Is the total still there?")
        child.expect("still 6")
        child.expect("you> ")
        child.sendline("/files")
        child.expect("you> ")
        child.sendline("/export /proc/nope")  # a folder that cannot be made: said, not fatal
        child.expect("/export failed")
        child.expect("you> ")
        child.sendline("Something slow again.")
        child.expect("slow again")
        time.sleep(2)
        child.sendintr()  # interrupts the cell...
        child.expect("interrupted the running cell")
        child.sendintr()  # ...and a second Ctrl-C ends the session, cleanly
        child.expect("ending the session")
        child.expect("session saved in")
        child.expect(pexpect.EOF)
        assert "Traceback" not in child.before
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    transcript = (tmp_path / "transcript.txt").read_text()
    assert transcript.count("the total is 6") == 1  # the answer once, not again in a panel
    assert "/workspace/figures" not in transcript  # charts by their host path only
    left = container_labels(owner)
    assert left == []  # ending mid-cell left no container behind
    trace = (folder / "trace.jsonl").read_text()
    assert trace.count('"type": "final"') >= 4  # the fifth question was cut short
    assert (folder / "notebook.ipynb").exists()


WIDE = [
    {
        "content": "Thought: show the table.",
        "tool_calls": [
            {
                "name": "python",
                "arguments": {
                    "code": "import numpy as np, pandas as pd\n"
                    "pd.DataFrame(np.arange(60).reshape(5, 12) * 1000.5,\n"
                    "             columns=[f'column_{i}' for i in range(12)])"
                },
            }
        ],
    },
    {"content": "Final Answer: the table is shown."},
]


@pytest.mark.docker
@pytest.mark.timeout(180)
@pytest.mark.xdist_group("chat")
def test_chat_shows_a_wide_table_at_the_terminal_s_width_and_the_model_its_own(tmp_path):
    """120 columns: the observation panel lays the DataFrame out 116 wide (11 of its 12
    columns in the first block), where pandas' text, which the model reads, wraps at 80."""
    (tmp_path / "script.json").write_text(json.dumps(WIDE))
    folder = tmp_path / "session"
    args = ["chat", "--output", str(folder), "--replay", str(tmp_path / "script.json")]
    child = sandcell_terminal(
        *args,
        # not TERM=dumb: rich takes a dumb terminal to be 80 columns wide, whatever its size
        env={"PATH": "/usr/bin:/bin", "TERM": "xterm-256color", "HOME": str(tmp_path)},
        encoding="utf-8",
        timeout=120,
        cwd=str(tmp_path),
        dimensions=(40, 120),  # a terminal 120 columns wide
    )
    child.str_last_chars = 4000
    child.logfile_read = transcript = io.StringIO()
    try:
        child.expect("you> ")
        child.sendline("Show me a table.")
        child.expect("table is shown")  # streamed: colour codes may split it elsewhere
        child.expect("you> ")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    lines = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", transcript.getvalue()).splitlines()
    header = [line for line in lines if "column_0" in line]
    assert len(header) == 1 and "column_10" in header[0], transcript.getvalue()
    assert all(len(line.rstrip()) <= 120 for line in lines)
    trace = [json.loads(line) for line in (folder / "trace.jsonl").open()]
    (seen,) = [o["text"] for r in trace for o in r.get("observations", [])]
    assert "column_6  \\" in seen and "column_10" not in seen.splitlines()[0]  # pandas' 80


def drawing(word: str) -> list[dict]:
    code = "import random\ndrawn = globals().get('drawn') or random.random()\nprint('" + word + "', drawn)"  # fmt: skip
    return [
        {"tool_calls": [{"name": "python", "arguments": {"code": code}}]},
        {"content": f"Final Answer: {word}."},
    ]


def chatting(tmp_path, name: str, *args: str) -> pexpect.spawn:
    (tmp_path / f"{name}.json").write_text(json.dumps(drawing(name)))
    child = sandcell_terminal(
        "chat", *args, "--replay", str(tmp_path / f"{name}.json"), "--timeout", "120",
        env={"PATH": "/usr/bin:/bin", "TERM": "dumb", "COLUMNS": "200", "HOME": str(tmp_path)},
        encoding="utf-8", timeout=120, cwd=str(tmp_path),
    )  # fmt: skip
    child.str_last_chars = 4000
    return child


def drawn_in(child: pexpect.spawn, word: str) -> str:
    child.expect("you> ")
    child.sendline("Draw a number, or show the one drawn.")
    child.expect(word + r" (0\.\d+)")
    value = child.match.group(1)
    child.expect("you> ")
    return value


@pytest.mark.docker
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("chat")
@pytest.mark.parametrize("runtime", ["runsc", "runc"])
def test_quit_pauses_and_resume_brings_the_kernel_back_or_replays_its_cells(tmp_path, runtime):
    """Under gVisor /quit pauses the kernel and --resume restores it: the same draw, with no
    cell run again. Under runc (no checkpoints) --resume re-runs the cells: a new draw."""
    from tests.missing import cannot_run
    from tests.test_pause import checkpoints_problem

    problem = checkpoints_problem() if runtime == "runsc" else None
    if problem:
        cannot_run(problem, "chat pause test")
    folder = tmp_path / "session"
    child = chatting(tmp_path, "first", "--output", str(folder), "--runtime", runtime)
    try:
        first = drawn_in(child, "first")
        if runtime == "runsc":
            child.sendline("/quit")
        else:
            child.sendeof()  # Ctrl-D leaves as /quit does
        if runtime == "runsc":
            child.expect("kernel paused in")
        else:
            child.expect(r"its kernel was not paused \(only a sandbox under gVisor")
        child.expect("continue it with  sandcell chat --resume")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert (folder / ".paused").is_dir() == (runtime == "runsc")

    # the printed command as it is: the runtime comes from the session's trace
    child = chatting(tmp_path, "again", "--resume", str(folder))
    try:
        if runtime == "runsc":
            child.expect("its kernel is back as it was")
        else:
            child.expect(r"rebuilt by re-running its 1 recorded cell\(s\)")
        again = drawn_in(child, "again")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert (again == first) == (runtime == "runsc")
    events = [json.loads(line) for line in (folder / "trace.jsonl").open()]
    kinds = [e["type"] for e in events]
    assert ("rebuilt" in kinds) == (runtime == "runc")
    assert [e["question"] for e in events if e["type"] == "question"] == [1, 2]
    assert json.loads((folder / "history.json").read_text())[0]["role"] == "user"
