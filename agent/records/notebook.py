"""Export a trace to a Jupyter notebook: questions and thoughts as markdown, python actions as
code cells with their recorded outputs and images, other tools and answers as markdown. The
code cells in order re-run the session in a sandbox with the same inputs."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from sandcell.agent.events import (
    Event,
    Final,
    InputsAdded,
    Question,
    Rebuilt,
    Reset,
    SessionStarted,
    Step,
)
from sandcell.agent.records.trace import read_events
from sandcell.sandbox.boundary import CHART_MIME, TABLE_MIME


def trace_to_notebook(events: list[Event]) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    sessions = 0
    for n, event in enumerate(events):
        match event:
            case SessionStarted() if sessions:  # the same session continued by a later process
                if not _did_anything(events[n + 1 :]):
                    continue  # a server restarted and the session was only looked at
                said = f"*The session was continued here (model `{event.model}`).*"
            case SessionStarted():
                names = ", ".join(f"`/data/{i['name']}`" for i in event.input_items()) or "none"
                said = (
                    f"# sandcell session\n\nModel `{event.model}`, protocol `{event.protocol}`; "
                    f"inputs: {names}."
                )
                sessions += 1
            case Rebuilt():
                said = (
                    f"*A fresh kernel was rebuilt here by re-running the {event.cells} cell(s) "
                    f"above ({event.skipped} that had been stopped left out).*"
                )
            case Question():
                said = f"## Question {event.question}\n\n{event.task or ''}"
            case Step():
                nb.cells.extend(_step_cells(event))
                continue
            case InputsAdded():
                names = ", ".join(f"`/data/{i['name']}`" for i in event.input_items())
                said = f"*Inputs added: {names}.*"
            case Reset():
                said = "*The kernel was reset here: a fresh kernel.*"
            case Final():
                text = f"**Answer:** {event.answer}" if event.answer else "**No answer.**"
                said = f"{text}\n\n*Stopped: {event.stop_reason}*"
            case _:
                continue
        nb.cells.append(new_markdown_cell(said))
    nbformat.validate(nb)
    return nb


def _did_anything(events: list[Event]) -> bool:
    """Whether a process that took the session up again did anything with it."""
    for event in events:
        match event:
            case SessionStarted():
                return False
            case Question() | Step() | InputsAdded() | Reset() | Rebuilt():
                return True
    return False


def export_notebook(trace_path: str | Path, notebook_path: str | Path) -> Path:
    nb = trace_to_notebook(read_events(trace_path))
    out = Path(notebook_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".ipynb.tmp")
    nbformat.write(nb, str(tmp))
    tmp.replace(out)  # never a half-written notebook
    return out


def _step_cells(event: Step) -> list:
    cells = []
    if event.thought:
        cells.append(new_markdown_cell(event.thought))
    for obs in event.observations or []:
        execution = obs.get("execution")
        if obs.get("tool") == "python" and execution is not None:
            cells.append(_code_cell(execution))
        else:
            args = obs.get("args")
            args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            cells.append(
                new_markdown_cell(
                    f"`{obs.get('tool')}` `{args_text}` →\n\n```\n{obs.get('text', '')}\n```"
                )
            )
    return cells


def _code_cell(execution: dict) -> nbformat.NotebookNode:
    cell = new_code_cell(
        execution.get("code", ""), execution_count=execution.get("execution_count")
    )
    outputs: list[nbformat.NotebookNode] = []
    for chunk in execution.get("stream", []):
        if outputs and outputs[-1].output_type == "stream" and outputs[-1].name == chunk["name"]:
            outputs[-1].text += chunk["text"]
        else:
            outputs.append(new_output("stream", name=chunk["name"], text=chunk["text"]))
    for result in execution.get("results", []):
        data = {k: v for k, v in result.get("data", {}).items() if isinstance(v, str)}
        for mime, kept in ((CHART_MIME, result.get("chart")), (TABLE_MIME, result.get("table"))):
            if kept is not None:  # checked when the cell ran: JSON, as a +json MIME type holds
                data[mime] = kept
        metadata = {
            k: v for k, v in result.get("metadata", {}).items() if not k.startswith("sandcell/")
        }
        if result.get("is_main"):
            outputs.append(
                new_output(
                    "execute_result",
                    data=data,
                    metadata=metadata,
                    execution_count=execution.get("execution_count"),
                )
            )
        else:
            outputs.append(new_output("display_data", data=data, metadata=metadata))
    error = execution.get("error")
    if error:
        outputs.append(
            new_output(
                "error",
                ename=error["name"],
                evalue=error["value"],
                traceback=error.get("traceback", []),
            )
        )
    cell.outputs = outputs
    return cell
