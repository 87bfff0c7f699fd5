"""Terminal control sequences (issue 21, finding 4): what a cell prints, what the model writes
and what an answer says reach a terminal with their control characters shown as visible
escapes, sandcell's own colours kept; piped output stays byte-exact. Units of the escaping
function and the real rich printer; then `sandcell exec` and `sandcell run` through a real
pseudo-terminal and through a pipe, with real sandboxes."""

import io
import json
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from sandcell.agent.cli.console import EventPrinter
from sandcell.agent.cli.terminal import for_terminal, visible
from sandcell.agent.events import ActionStarted, Event, Final, Notice, Observation, Output, Token
from sandcell.sandbox import render
from sandcell.sandbox.execution import Execution, ExecutionError, Result, StreamChunk
from tests.cli_runner import sandcell, sandcell_terminal

pytestmark = pytest.mark.timeout(60)

OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # writes "rm -rf ~" to the clipboard, BEL-terminated
OSC0 = "\x1b]0;owned\x1b\\"  # the window title, ST-terminated
OSC8 = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"  # a hyperlink
CSI = "\x1b[2J\x1b[5;5H"  # clear the screen, move the cursor
SGR = re.compile(r"\x1b\[[0-9;]*m")  # colours: the only sequences sandcell itself writes


@pytest.mark.parametrize(
    "raw,shown",
    [
        (OSC52, "\\x1b]52;c;cm0gLXJmIH4=\\x07"),
        (OSC0, "\\x1b]0;owned\\x1b\\"),
        (OSC8, "\\x1b]8;;https://evil.example/\\x1b\\click\\x1b]8;;\\x1b\\"),
        (CSI, "\\x1b[2J\\x1b[5;5H"),
        ("\x9b31m", "\\x9b31m"),  # C1 CSI, one character
        ("\x9d0;t\x9c", "\\x9d0;t\\x9c"),  # C1 OSC ... ST
        ("a\x1bb", "a\\x1bb"),  # a lone ESC
        ("bell\x07 bs\x08 cr\r del\x7f nul\x00", "bell\\x07 bs\\x08 cr\\x0d del\\x7f nul\\x00"),
        ("evil\u202etxt.exe", "evil\\u202etxt.exe"),  # a right-to-left override
        ("lines\n\tand tabs stay\n", "lines\n\tand tabs stay\n"),
        ("é, 中文, emoji 🙂, [brackets]", "é, 中文, emoji 🙂, [brackets]"),
    ],
)  # fmt: skip
def test_visible_shows_every_control_character(raw, shown):
    assert visible(raw) == shown
    assert "\x1b" not in visible(raw) and "\x9b" not in visible(raw)


def test_visible_is_the_same_for_a_stream_split_anywhere():
    text = f"a{OSC52}b{CSI}c\x9bd"
    assert all(visible(text[:i]) + visible(text[i:]) == visible(text) for i in range(len(text)))


def test_for_terminal_leaves_piped_text_as_it_is():
    text = f"{OSC52}{CSI}\x9b"
    assert for_terminal(text, False) == text and for_terminal(text, True) == visible(text)


def printed(terminal: bool, events: list[Event], width: int = 100) -> str:
    out = io.StringIO()
    colours = "standard" if terminal else None
    console = Console(
        file=out, force_terminal=terminal, color_system=colours, width=width, highlight=False
    )
    printer = EventPrinter(console)
    for event in events:
        printer(event)
    return out.getvalue()


EVENTS = [
    Token(text=f"Thought: {OSC0}look"),
    ActionStarted(tool="python", args={"code": f"print('{CSI}')  # {OSC8}"}),
    Output(name="stdout", text=f"out {OSC52}\n"),
    Observation(tool="python", ok=False, text=f"other {OSC52}"),
    Notice(text=f"note {CSI}"),
    Final(
        question=1,
        tokens=0,
        duration_s=0.0,
        answer=f"done {OSC8}",
        stop_reason="answered",
        detail="",
        error=None,
        steps=1,
    ),  # fmt: skip
]


def test_the_printer_escapes_others_control_bytes_and_keeps_its_own_colours():
    shown = printed(True, EVENTS)
    assert "\x1b" not in SGR.sub("", shown)  # every escape left is one of rich's colours
    assert SGR.search(shown)  # and the colours are there
    assert "\\x1b]52;c;" in shown and "\\x1b]0;owned" in shown and "\\x1b[2J" in shown


def test_the_printer_to_a_pipe_keeps_the_text_as_it_is():
    shown = printed(False, EVENTS[2:3])
    assert shown == f"out {OSC52}\n".replace("\x07", "")  # rich itself drops BEL, as before


def cell_printing(text: str) -> str:
    return f"import sys; sys.stdout.write({text!r}); sys.stdout.flush()"


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_exec_on_a_terminal_shows_a_cells_control_sequences_as_escapes(tmp_path):
    code = cell_printing(f"clip{OSC52} title{OSC0} moved{CSI} c1\x9b31m end\n")
    child = sandcell_terminal(
        "exec", "-c", code, env={**os.environ, "TERM": "xterm-256color"}, timeout=150
    )
    raw = child.read()  # every byte the terminal received, to the end
    child.close()
    assert child.exitstatus == 0, raw
    assert b"\x1b" not in raw and "\x9b".encode() not in raw, raw
    text = raw.decode()
    assert "clip\\x1b]52;c;cm0gLXJmIH4=\\x07" in text and "title\\x1b]0;owned\\x1b\\" in text
    assert "c1\\x9b31m end" in text


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_exec_to_a_pipe_is_byte_exact():
    text = f"clip{OSC52} title{OSC0} link{OSC8} c1\x9b31m tab\tend\n"
    done = sandcell("exec", "-c", cell_printing(text), text=False, timeout=150)
    assert done.returncode == 0, done.stderr
    assert done.stdout == text.encode()


def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    cell = cell_printing(f"from the cell{OSC52}\n")
    replies = [
        {"content": f"Thought: print it.{OSC0}", "tool_calls": [{"name": "python", "arguments": {"code": cell}}]},
        f"Final Answer: done {CSI}\x1b[31mred{OSC8}",
    ]  # fmt: skip
    path.write_text(json.dumps(replies))
    return path


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_run_on_a_terminal_keeps_its_colours_and_escapes_everything_else(tmp_path):
    args = ["run", "--task", "x", "--output", str(tmp_path / "out"), "--replay", str(script(tmp_path)), "--protocol", "tools"]  # fmt: skip
    child = sandcell_terminal(
        *args,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"},
        timeout=150,
    )
    raw = child.read().decode()
    child.close()
    assert child.exitstatus == 0, raw
    assert SGR.search(raw), raw  # sandcell's own colours (panels, the code) still show
    assert "\x1b" not in SGR.sub("", raw), raw  # and nothing else reaches the terminal raw
    assert "\\x1b]52;c;" in raw and "done \\x1b[2J\\x1b[5;5H\\x1b[31mred" in raw


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_run_to_a_pipe_writes_the_answer_byte_exact(tmp_path):
    args = ["run", "--task", "x", "--output", str(tmp_path / "out"), "--replay", str(script(tmp_path)), "--protocol", "tools"]  # fmt: skip
    done = sandcell(*args, text=False, timeout=150)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"done {CSI}\x1b[31mred{OSC8}\n".encode()


def test_chat_shows_a_cells_printed_line_once_and_the_rest_in_the_observation_panel():
    ex = Execution(
        stream=[StreamChunk("stdout", "printed-once-line\n")],
        results=[Result({"text/plain": "   units\nNorth  20"}, is_main=True)],
        error=ExecutionError(
            "ValueError", "bad value", ["Cell In[1], line 3", "ValueError: bad value"]
        ),
    )
    shown = printed(False, [
        ActionStarted(tool="python", args={"code": "print('printed-once-line')"}),
        Output(name="stdout", text="printed-once-line\n"),
        Observation(tool="python", ok=False, text=render(ex), execution=ex),
    ])  # fmt: skip
    assert shown.count("printed-once-line") == 2  # the code, then the output once
    assert "North  20" in shown and "ValueError: bad value" in shown and "observation" in shown
    # output alone: no panel repeats it
    quiet = Execution(stream=[StreamChunk("stdout", "only-output\n")])
    shown = printed(False, [
        Output(name="stdout", text="only-output\n"),
        Observation(tool="python", ok=True, text=render(quiet), execution=quiet),
    ])  # fmt: skip
    assert shown.count("only-output") == 1 and "observation" not in shown


def wide_frame_result():
    """A 12-column DataFrame's result as the kernel sends it: pandas' text (80 wide, as the
    model reads it) and pandas' HTML table."""
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame(
        np.arange(60).reshape(5, 12) * 1000.5, columns=[f"column_{i}" for i in range(12)]
    )
    frame = frame.astype({"column_11": object})
    frame.iloc[0, 11] = f"[bold]x{CSI}"  # markup and a control sequence, from the data
    with pd.option_context("display.width", 80, "display.max_columns", 20):  # the kernel's
        text = repr(frame)
    return Result({"text/plain": text, "text/html": frame._repr_html_()}, is_main=True)


def test_chat_lays_a_table_out_at_its_panel_s_width_the_model_keeps_its_text():
    result = wide_frame_result()
    assert "column_6  \\\n" in result.data["text/plain"]  # pandas wrapped it at 80
    ex = Execution(results=[result])
    event = Observation(tool="python", ok=True, text=render(ex), execution=ex)
    shown = printed(True, [event], width=120)
    lines = SGR.sub("", shown).splitlines()
    header = [line for line in lines if "column_" in line]
    # one block holds column_0 to column_10 (116 cells inside the panel), the rest below it
    assert len(header) == 2 and "column_10" in header[0] and "column_11" in header[1], shown
    below = lines.index(header[1])
    cell = lines[below + 1].rstrip(" │")
    assert cell.endswith("0  [bold]x\\x1b[2J\\x1b[5;5H")  # the cell's text as text, escaped
    assert len(cell) == len(header[1].rstrip(" │"))  # and measured so: right-aligned
    assert all(len(line) <= 120 for line in lines)
    assert "column_6  \\" in event.text  # what the model reads is pandas' own 80 columns
    narrow = SGR.sub("", printed(True, [event], width=60)).splitlines()
    blocks = [line for line in narrow if "column_" in line]  # 0-4, 5-9, 10 and 11
    assert len(blocks) == 3 and all(len(line) <= 60 for line in narrow), narrow
