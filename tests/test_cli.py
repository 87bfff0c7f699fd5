"""The `sandcell` command in-process with click's CliRunner: usage errors, help, and the one
error -> exit status map (agent/cli/exits.py). Nothing here starts a container; the tests
that need one run the real command in a subprocess (test_cli_exec.py, test_jobs.py)."""

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandcell.agent.cli import COMMANDS, exits, main
from sandcell.agent.seams import ModelError, RunResult, Terminated, ToolsUnsupported
from sandcell.sandbox.errors import SandboxError, SandboxUnavailable
from sandcell.sandbox.execution import Execution, ExecutionError

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/sandcell-test-docker.sock"}
NO_MODEL = {"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None, "SANDCELL_MODEL": None}
MODEL_OPTIONS = ["--model", "--base-url", "--api-key", "--replay", "--protocol", "--max-steps"]
LIMIT_OPTIONS = ["--wall", "--timeout", "--memory", "--cpus", "--max-rich-outputs", "--max-rich-mb"]
LIMIT_OPTIONS += ["--wheelhouse", "--transport"]


def sandcell(*args: str, env: dict | None = None, stdin: str | None = None):
    return CliRunner().invoke(main, list(args), env=env, input=stdin, prog_name="sandcell")


# -- the group -----------------------------------------------------------------------------------


def test_help_lists_every_command():
    helped = sandcell("--help")
    assert helped.exit_code == 0 and "Usage:" in helped.stdout
    names = [
        "batch",
        "chat",
        "doctor",
        "exec",
        "gc",
        "image",
        "mcp",
        "packages",
        "recipe",
        "replay",
    ]
    names += ["report", "run", "serve", "tool"]
    assert sorted(COMMANDS) == names
    for name in COMMANDS:
        assert f"  {name} " in helped.stdout


HELP = {
    "exec": ["--input", "--timeout", "--memory", "--max-rich-outputs", "--max-rich-mb", "--json"]
    + ["-c", "[FILE]", "124 timed out", "--wheelhouse", "--transport"],
    "gc": ["Remove sandbox containers (and their input volumes)"],
    "report": ["DIR", "Rebuild the batch report of DIR"],
    "tool": ["NAME [ARGS]", "--input"],
    "replay": ["TRACE", "--input", "--image", "1 some differ"],
    "run": ["--task", "--input", "--output", *MODEL_OPTIONS, *LIMIT_OPTIONS],
    "batch": [
        "JOBS_FILE",
        "--output",
        "--workers",
        "--no-progress",
        *MODEL_OPTIONS,
        "--wheelhouse",
        "--transport",
    ],
    "chat": ["--input", "--output", *MODEL_OPTIONS, *LIMIT_OPTIONS],
    "mcp": ["--input", "--output", "--http", "--host", "--port", "--users", "--timeout", "--cpus"]
    + ["--max-rich-outputs", "--max-rich-mb", "--wheelhouse", "--transport"],
    "packages": ["add", "list", "remove"],
    "doctor": ["--runtime", "--transport", "--ray"],
}


@pytest.mark.parametrize("name", sorted(HELP))
def test_help_of_each_command_lists_its_options(name):
    result = sandcell(name, "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Usage: sandcell {name} [OPTIONS]")
    for text in HELP[name]:
        assert text in result.stdout, f"{name} --help lacks {text}"


def every_help(command=main, path=()):
    """(command path, its --help text) for the group and every command under it."""
    import click

    yield path, sandcell(*path, "--help").output
    if isinstance(command, click.Group):
        for name in command.list_commands(None):
            yield from every_help(command.get_command(None, name), (*path, name))


# words by which a help text promises what the command does not do yet
PROMISES = re.compile(r"\b(later|future|soon|not yet|coming|planned|todo|will be)\b", re.I)


def test_no_help_text_promises_a_later_feature():
    helps = dict(every_help())
    assert {("serve",), ("image", "build"), ("tool",)} <= set(helps)  # every level is read
    for path, text in helps.items():
        assert text.startswith("Usage: "), path
        promise = PROMISES.search(" ".join(text.split()))  # help wraps lines
        assert promise is None, f"sandcell {' '.join(path)} --help promises: {promise.group(0)!r}"
    assert "a page for people" in " ".join(helps[("serve",)].split())


def test_help_and_version_load_no_model_client():
    """Subcommands load on use: `exec`, `gc` and `tool` never import openai (a fresh
    interpreter, since this test process has imported everything already)."""
    code = (
        "import sys\nfrom sandcell.agent.cli import main\n"
        "for args in (['--version'], ['exec', '--help'], ['gc', '--help'], ['tool', '--help']):\n"
        "    try:\n        main(args)\n    except SystemExit as done:\n"
        "        assert done.code == 0, (args, done.code)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'openai'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines()[-1] == "[]"


def test_an_unknown_command_or_flag_is_a_usage_error():
    unknown = sandcell("nope")
    assert unknown.exit_code == exits.USAGE == 2
    assert "No such command 'nope'" in unknown.stderr
    flag = sandcell("exec", "--bogus")
    assert flag.exit_code == 2 and "No such option '--bogus'" in flag.stderr
    bad_value = sandcell("batch", "x.jsonl", "--output", "o", "--workers", "0")
    assert bad_value.exit_code == 2 and "Invalid value" in bad_value.stderr


# -- usage errors of each command -----------------------------------------------------------------


def test_exec_takes_code_from_exactly_one_place(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("print(1)\n")
    both = sandcell("exec", "-c", "1", str(script))
    assert both.exit_code == 2
    assert "give the code either with -c CODE or as FILE (- for stdin)" in both.stderr
    missing = sandcell("exec", "--input", str(tmp_path / "gone.csv"), "-c", "1")
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


def test_batch_with_a_malformed_jobs_file_names_the_line(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"id": "a", "task": "x"}\n\n{"id": "a", "task": "y"}\n')
    twice = sandcell("batch", str(jobs), "--output", str(tmp_path / "o"))
    assert twice.exit_code == 2
    assert f"{jobs}:3: id 'a' is used twice" in twice.stderr
    jobs.write_text('{"id": "b", "task": "x", "inputs": ["nowhere.csv"]}\n')
    gone = sandcell("batch", str(jobs), "--output", str(tmp_path / "o"))
    assert gone.exit_code == 2 and f"{jobs}:1: input " in gone.stderr
    assert not (tmp_path / "o").exists()  # nothing ran


def test_batch_of_a_missing_jobs_file_is_a_usage_error(tmp_path):
    result = sandcell("batch", str(tmp_path / "none.jsonl"), "--output", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_replay_of_a_missing_file_is_a_usage_error(tmp_path):
    result = sandcell("replay", str(tmp_path / "trace.jsonl"))
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_replay_of_what_is_not_a_trace_is_a_usage_error(tmp_path):
    text = tmp_path / "notes.jsonl"
    text.write_text('{"type": "session"}\nnot json\n')
    result = sandcell("replay", str(text))
    assert result.exit_code == 2
    assert f"{text}:2 is not a JSON trace event" in result.stderr
    binary = tmp_path / "image.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    result = sandcell("replay", str(binary))
    assert result.exit_code == 2 and "is not a trace: it is not UTF-8 text" in result.stderr


@pytest.mark.parametrize("as_dict", [False, True], ids=["path", "record"])
def test_replay_names_missing_inputs_and_how_to_pass_them(tmp_path, as_dict):
    trace = tmp_path / "trace.jsonl"
    recorded = str(tmp_path / "moved" / "sales.csv")
    if as_dict:  # newer traces record each input as {"name", "path", "size", "sha256"}
        recorded = {"name": "sales.csv", "path": recorded, "size": 12, "sha256": "0" * 64}
    session = {"type": "session", "inputs": [recorded]}
    trace.write_text(json.dumps(session) + "\n")
    result = sandcell("replay", str(trace))
    assert result.exit_code == 2
    assert f"input file(s) of the recorded run not found: {tmp_path}/moved/sales.csv" in (
        result.stderr
    )
    assert "--input PATH (matched by file name)" in result.stderr


def test_replay_of_a_trace_without_code_needs_no_sandbox(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"type": "session", "inputs": []}\n{"type": "question", "task": "hi"}\n')
    result = sandcell("replay", str(trace), env=NO_ENGINE)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{trace}: no python cells recorded; nothing to replay\n"


BAD_INPUTS = {
    "two inputs of one name": (
        lambda d: [d / "a" / "sales.csv", d / "b" / "sales.csv"],
        "sandcell: two inputs are named sales.csv",
    ),
    "a device": (lambda d: ["/dev/null"], "sandcell: input /dev/null is not a regular file"),
}
COMMANDS_WITH_INPUTS = {
    "tool": ["tool", "file_metadata", '{"path": "/data/sales.csv"}'],
    "exec": ["exec", "-c", "1"],
    "run": ["run", "--task", "x", "--output", "{out}", "--replay", "{script}"],
    "chat": ["chat", "--output", "{out}", "--replay", "{script}"],
}


@pytest.mark.parametrize("bad", BAD_INPUTS)
@pytest.mark.parametrize("command", COMMANDS_WITH_INPUTS)
def test_bad_inputs_are_one_usage_error_in_every_command(tmp_path, bad, command):
    """One check (sandbox.inputs) and one message, exit 2, before any sandbox or folder."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "sales.csv").write_text("n\n1\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["Final Answer: 1"]))
    out = tmp_path / "out"
    paths, message = BAD_INPUTS[bad]
    args = [
        a.replace("{out}", str(out)).replace("{script}", str(script))
        for a in COMMANDS_WITH_INPUTS[command]
    ]
    for path in paths(tmp_path):
        args += ["--input", str(path)]
    result = sandcell(*args, stdin="")
    assert result.exit_code == exits.USAGE == 2, result.output
    assert result.stderr.startswith(message) and "Traceback" not in result.output
    assert not out.exists()


# -- errors mapped by exits.reported(): one line on stderr, the status, no traceback --------------


@pytest.mark.parametrize("args", [["gc"], ["exec", "-c", "1"]])
def test_no_docker_engine_exits_3_with_what_to_do(args):
    result = sandcell(*args, env=NO_ENGINE)
    assert result.exit_code == exits.UNAVAILABLE == 3
    assert result.stderr.startswith("sandcell: no Docker engine answers")
    assert "make engine" in result.stderr and "Traceback" not in result.output
    assert result.stdout == ""


def test_batch_without_a_usable_model_exits_4_before_any_job(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"id": "a", "task": "count the rows"}\n')
    out = tmp_path / "o"
    result = sandcell("batch", str(jobs), "--output", str(out), env=NO_MODEL)
    assert result.exit_code == exits.MODEL == 4
    assert result.stderr.startswith("sandcell: no API key for https://api.openai.com/v1")
    assert "Traceback" not in result.output and not (out / "results.jsonl").exists()


def test_run_without_a_usable_model_exits_4(tmp_path):
    result = sandcell("run", "--task", "x", "--output", str(tmp_path / "o"), env=NO_MODEL)
    assert result.exit_code == 4
    assert result.stderr == (
        "sandcell: no API key for https://api.openai.com/v1: set OPENAI_API_KEY (or pass "
        "--api-key), or point OPENAI_BASE_URL at a local server (vLLM, Ollama, llama.cpp)\n"
    )


def test_demo_exits_4_for_a_model_error_as_the_readme_says(monkeypatch, capsys, tmp_path):
    from sandcell.agent.cli import demo

    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.openai.com/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(sys, "argv", ["demo", "--output", str(tmp_path / "demo")])
    with pytest.raises(SystemExit) as done:
        demo.main()
    assert done.value.code == exits.MODEL
    assert capsys.readouterr().err.startswith("sandcell: no API key for https://api.openai")


# -- the map itself -------------------------------------------------------------------------------


def test_statuses_are_the_documented_numbers():
    assert (exits.OK, exits.STOPPED, exits.USAGE, exits.UNAVAILABLE, exits.MODEL) == (0, 1, 2, 3, 4)
    assert (exits.TIMEOUT, exits.DIED, exits.INTERRUPTED, exits.TERMINATED) == (124, 137, 130, 143)
    assert exits.INTERNAL == 70


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ModelError("endpoint down"), 4),
        (ToolsUnsupported("no tools here"), 4),
        (SandboxError("container would not start"), 3),
        (SandboxUnavailable("no image"), 3),
        (KeyboardInterrupt(), 130),
        (Terminated(), 143),
        (ValueError("a bug"), 70),
    ],
)
def test_for_error(error, status):
    assert exits.for_error(error) == status


@pytest.mark.parametrize(
    ("result", "status"),
    [
        (RunResult("42 rows", "answered"), 0),
        (RunResult(None, "model_error", error="endpoint down"), 4),
        (RunResult(None, "sandbox_error", error="container died"), 3),
        (RunResult(None, "max_steps"), 1),
        (RunResult(None, "repeated_action"), 1),
        (RunResult("a forced answer", "wall_time"), 1),  # an answer, but the run was stopped
    ],
)
def test_for_result(result, status):
    assert exits.for_result(result) == status


@pytest.mark.parametrize(
    ("execution", "status"),
    [
        (Execution(code="1 + 1"), 0),
        (
            Execution(
                code="1/0", error=ExecutionError("ZeroDivisionError", "division by zero", [])
            ),
            1,
        ),
        (Execution(code="while True: pass", timed_out=True, interrupted=True), 124),
        (Execution(code="loop", timed_out=True, restarted="timeout"), 124),
        (Execution(code="os.kill(...)", restarted="died"), 137),
    ],
)
def test_for_execution(execution, status):
    assert exits.for_execution(execution) == status


def test_reported_words_known_errors_and_saves_a_bug_s_traceback(capsys, tmp_path):
    with pytest.raises(SystemExit) as done, exits.reported():
        raise SandboxUnavailable("the sandbox image x is missing: run `sandcell image build`")
    assert done.value.code == 3
    assert capsys.readouterr().err == (
        f"sandcell: the sandbox image x is missing: run `sandcell image build` ({exits.DOCTOR})\n"
    )
    with pytest.raises(SystemExit) as done, exits.reported():
        raise KeyboardInterrupt
    assert done.value.code == 130 and capsys.readouterr().err == "sandcell: interrupted\n"
    with pytest.raises(SystemExit) as done, exits.reported():
        raise Terminated()
    assert done.value.code == 143 and "terminated (SIGTERM)" in capsys.readouterr().err
    exits.keep_details_in(tmp_path)
    with pytest.raises(SystemExit) as done, exits.reported():
        1 / 0  # noqa: B018  a bug
    err = capsys.readouterr().err
    assert done.value.code == exits.INTERNAL == 70
    assert err.startswith(
        "sandcell: internal error: ZeroDivisionError: division by zero; details in "
    )
    assert err.count("\n") == 1 and "Traceback" not in err
    details = Path(err.rsplit("details in ", 1)[1].strip())
    assert details.parent == tmp_path and "1 / 0" in details.read_text()
    exits.Debug.enabled = True
    try:
        with pytest.raises(ZeroDivisionError), exits.reported():
            1 / 0  # noqa: B018  --debug: the traceback itself
    finally:
        exits.Debug.enabled, exits.Debug.details_dir = False, None


@pytest.mark.docker  # `run` checks the engine and starts its sandbox before the bug fires
@pytest.mark.timeout(120)
def test_an_internal_error_in_a_command_is_one_line_and_a_file(tmp_path, monkeypatch):
    """Through the real CLI: a bug inside `run` (here a profile that cannot be built at all)
    prints one line naming a file in the output folder that holds the traceback; --debug
    shows the traceback instead."""
    from sandcell.agent import session

    def broken(inputs, memory_mb=None):
        raise RuntimeError("profiles are broken")

    monkeypatch.setattr(session, "inputs_profile", broken)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["Final Answer: 1"]))
    data = tmp_path / "a.csv"
    data.write_text("a\n1\n")
    args = ["run", "--task", "x", "--input", str(data), "--replay", str(script)]
    result = sandcell(*args, "--output", str(tmp_path / "o"))
    assert result.exit_code == 70, result.output
    assert result.stderr.startswith("sandcell: internal error: RuntimeError: profiles are broken;")
    details = Path(result.stderr.rsplit("details in ", 1)[1].strip())
    assert details.parent == tmp_path / "o" and "profiles are broken" in details.read_text()
    debug = sandcell("--debug", *args, "--output", str(tmp_path / "o2"))
    assert debug.exit_code == 1 and isinstance(debug.exception, RuntimeError)


# -- every flag has a range, and bad values are one clear usage error ----------------------------


@pytest.mark.parametrize(
    "args,words",
    [
        (["run", "--timeout", "-1"], "--timeout"),
        (["run", "--timeout", "0"], "--timeout"),
        (["run", "--memory", "5"], "--memory"),
        (["run", "--memory", "0"], "--memory"),
        (["run", "--max-steps", "0"], "--max-steps"),
        (["run", "--cpus", "999"], "--cpus"),
        (["run", "--wall", "0"], "--wall"),
        (["chat", "--temperature", "9"], "--temperature"),
        (["exec", "-c", "1", "--timeout", "-1"], "--timeout"),
        (["exec", "-c", "1", "--memory", "5"], "--memory"),
        (["run", "--task", "  "], "the task is empty"),
    ],
)
def test_bad_numbers_and_an_empty_task_are_usage_errors(tmp_path, args, words):
    if args[0] == "run" and "--task" not in args:
        args = [*args, "--task", "x"]
    if args[0] == "run":
        args = [*args, "--output", str(tmp_path / "o")]
    result = sandcell(*args)
    assert result.exit_code == 2, result.output
    assert words in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_batch_refuses_one_replay_for_all_jobs(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"id": "a", "task": "x"}\n')
    script = tmp_path / "s.json"
    script.write_text("[]")
    result = sandcell("batch", str(jobs), "--output", str(tmp_path / "o"), "--replay", str(script))
    assert result.exit_code == 2 and '"replay" field' in result.stderr


def test_run_refuses_a_non_empty_output_folder_before_anything_starts(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "old.txt").write_text("old")
    result = sandcell("run", "--task", "x", "--output", str(out))
    assert result.exit_code == 2 and "is not empty" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]


def test_batch_with_a_broken_job_script_is_a_usage_error_naming_the_line(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps([{"tool_calls": [{"arguments": {}}]}]))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"id": "a", "task": "x"}\n{"id": "b", "task": "y", "replay": "bad.json"}\n')
    result = sandcell("batch", str(jobs), "--output", str(tmp_path / "o"))
    assert result.exit_code == 2 and f"{jobs}:2:" in result.stderr and '"name"' in result.stderr
    assert not (tmp_path / "o").exists()


def test_serve_claims_its_data_folder_alone_and_says_why_it_cannot(tmp_path):
    import click

    from sandcell.agent.cli.serve import claim_data

    held = claim_data(tmp_path / "d")
    try:  # (an flock is per open file: a second claim from this process is refused too)
        with pytest.raises(click.UsageError, match=rf"in use by another sandcell serve \(pid {os.getpid()}\)"):  # fmt: skip
            claim_data(tmp_path / "d")
    finally:
        held.close()
    claim_data(tmp_path / "d").close()  # free once the holder has gone
    (tmp_path / "file").write_text("x")
    with pytest.raises(click.UsageError, match="Not a directory; give a folder this user can"):
        claim_data(tmp_path / "file" / "d")


def test_a_library_warning_is_one_sandcell_line_its_traceback_in_a_file(capsys, tmp_path):
    """Every sandcell.* logger's warning (a retried request, a tool that failed) reaches the
    terminal as one `sandcell:` line, its traceback kept in a file it names."""
    kept, exits.Debug.details_dir = exits.Debug.details_dir, tmp_path
    restore = exits.setup_logging(debug=False)
    try:
        try:
            raise ValueError("the cause")
        except ValueError:
            logging.getLogger("sandcell.agent.loop").warning("it failed", exc_info=True)
        logging.getLogger("sandcell.sandbox.pool").info("not shown")
    finally:
        restore()
        exits.Debug.details_dir = kept
    assert logging.getLogger("sandcell").propagate  # as it was
    said = capsys.readouterr().err
    assert re.fullmatch(r"sandcell: it failed; details in \S+\n", said), said
    (details,) = tmp_path.glob("sandcell-error-*.txt")
    assert "ValueError: the cause" in details.read_text() and str(details) in said
