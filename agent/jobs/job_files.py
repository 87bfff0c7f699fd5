"""What a finished job leaves beside its trace and notebook: answer.md (the answer, or why
there is none, and how its checks went), then audit.json with its section of answer.md."""

from pathlib import Path

from sandcell.agent import stops
from sandcell.agent.events import NetConnection
from sandcell.agent.jobs.audit import write_audit
from sandcell.agent.output_checks import markdown
from sandcell.agent.records.trace import read_events
from sandcell.agent.seams import RunResult
from sandcell.tools.file_metadata import InputsLike


def write_answer(result: RunResult, folder: Path) -> Path:
    path = folder / "answer.md"
    if result.answer is not None:
        text = result.answer.rstrip() + "\n"
    elif result.stop_reason in (stops.INTERRUPTED, stops.TERMINATED):
        text = (
            f"No answer: the run was {result.detail or result.stop_reason} after {result.steps} "
            "steps. The trace, the notebook of the finished cells and the files so far are "
            "kept beside this file.\n"
        )
    else:
        text = f"No answer: the run stopped ({result.stop_reason}). {result.detail}\n"
    if result.checks is not None:
        text += "\n" + markdown(result.checks)
    path.write_text(text, encoding="utf-8")
    return path


def write_job_files(result: RunResult, inputs: InputsLike, folder: Path) -> None:
    """answer.md, then the audit of what the job's cleaning changed (`sandcell run`, and each
    job of a batch)."""
    write_answer(result, folder)
    events = read_events(result.trace_path) if result.trace_path else []
    write_audit(inputs, result.files, folder, [e for e in events if isinstance(e, NetConnection)])
