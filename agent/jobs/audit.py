"""What a job's cleaning changed: `audit.json` in its folder, and a section of its answer.md.

Every input and output table is profiled with the file-metadata profile (tools.profile, the
same the model is shown), with distinct values and duplicate rows counted too. Inputs are read
on the host from their original paths; outputs from the files copied back into the folder,
never from anything the sandbox says about them. Each output is then set beside its input:
the input with the same columns, else the only input table.

Files over the profile's full-read cap are profiled from their first bytes: their counts are
estimates (`exact: false`) and the audit says so."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sandcell.agent.events import NetConnection
from sandcell.sandbox.inputs import Inputs
from sandcell.tools.file_metadata import InputsLike, profile_file
from sandcell.tools.profile import DEFAULT_CAPS, Profile, human_size
from sandcell.tools.registry import ToolError

AUDIT = "audit.json"
VERSION = 1
MAX_FILES = 50  # tables audited on each side: a job that writes thousands of files is cut
MAX_CONNECTIONS = 200  # --allow-net connections listed (all are counted)
# the prompt's caps (16 MiB read whole, 5 s of parsing), plus distinct values held per column
CAPS = dataclasses.replace(DEFAULT_CAPS, distinct=200_000)
TABLE_KINDS = {"csv", "tsv", "json", "jsonl", "parquet", "xlsx"}


def table(profile: Profile, path: str, **where: str) -> dict:
    """One file's entry: its shape, and each column's dtype, nulls and distinct values."""
    exact = profile.rows_exact and not any(c.nulls_note for c in profile.columns)
    return {
        "path": path,
        **where,
        "kind": profile.kind,
        "bytes": profile.size,
        "sha256": profile.sha256,
        "rows": profile.rows,
        "exact": exact,
        "duplicate_rows": profile.duplicate_rows,
        # counted in part of the file (a cap): what was found is a floor
        "duplicates_at_least": profile.duplicate_rows is not None
        and (profile.duplicates_more or not exact),
        "columns": [
            {
                "name": c.name,
                "dtype": c.type,
                "nulls": c.nulls,
                "distinct": c.distinct,
                "distinct_at_least": c.distinct_more or (not exact and c.distinct is not None),
            }
            for c in profile.columns
        ],
        "notes": [*_cap_note(profile), *profile.notes],
    }


def _cap_note(profile: Profile) -> list[str]:
    if profile.sha256 is not None or profile.kind == "empty":
        return []
    return [
        f"over {human_size(CAPS.full_bytes)}: profiled from its first "
        f"{human_size(CAPS.head_bytes)}; rows, nulls, distinct values and duplicates are "
        "estimates from that part"
    ]


def _profiled(path: Path, shown: str, notes: list[str]) -> Profile | None:
    try:
        return profile_file(path, shown, CAPS)
    except ToolError as error:  # a symlink, a FIFO, a file gone: said, the others go on
        notes.append(f"{shown}: not audited: {error}")
        return None


def change(before: dict, after: dict, matched_by: str) -> dict:
    """What happened between an input table and an output table."""
    old = {c["name"]: c for c in before["columns"]}
    new = {c["name"]: c for c in after["columns"]}
    dup_in, dup_out = before["duplicate_rows"], after["duplicate_rows"]
    return {
        "input": before["path"],
        "output": after["path"],
        "matched_by": matched_by,
        "exact": before["exact"] and after["exact"],
        "rows_in": before["rows"],
        "rows_out": after["rows"],
        "duplicate_rows_in": dup_in,
        "duplicate_rows_out": dup_out,
        "duplicates_removed": max(0, dup_in - dup_out)
        if dup_in is not None and dup_out is not None
        else None,
        "columns_added": [n for n in new if n not in old],
        "columns_removed": [n for n in old if n not in new],
        "columns_retyped": [
            {"column": n, "from": old[n]["dtype"], "to": new[n]["dtype"]}
            for n in new
            if n in old and old[n]["dtype"] != new[n]["dtype"]
        ],
        "nulls": {
            n: {"before": old[n]["nulls"] if n in old else None, "after": new[n]["nulls"]}
            for n in new
        },
    }


def _match(output: dict, inputs: list[dict]) -> tuple[dict, str] | None:
    names = {c["name"] for c in output["columns"]}
    same = [i for i in inputs if {c["name"] for c in i["columns"]} == names]
    if same:
        return same[0], "same columns"
    if len(inputs) == 1:
        return inputs[0], "only input"
    return None


def audit(
    inputs: InputsLike,
    files: Iterable[str | Path],
    folder: Path,
    network: Iterable[NetConnection] = (),
) -> dict:
    """The audit of one job: `inputs` as the job was given them (host paths, or Inputs),
    `files` the host paths of what was copied back into `folder`, `network` the connections
    its cells made through the sandbox's proxy (--allow-net; from its trace)."""
    inputs = Inputs.from_paths(inputs, files_only=False)  # the API's Job takes plain paths too
    notes: list[str] = []
    ins: list[dict[str, Any]] = []
    outs: list[dict[str, Any]] = []
    for item in inputs:
        if len(ins) >= MAX_FILES:
            notes.append(f"only the first {MAX_FILES} input tables were audited")
            break
        if item.size is None:
            notes.append(f"{item.sandbox_path}: a folder, not audited")
            continue
        p = _profiled(item.path, item.name, notes)
        if p is not None and p.kind in TABLE_KINDS:
            ins.append(table(p, item.name, source=str(item.path)))
    for path in sorted(Path(f) for f in files):
        if len(outs) >= MAX_FILES:
            notes.append(f"only the first {MAX_FILES} output tables were audited")
            break
        shown = os.path.relpath(path, folder)
        p = _profiled(path, shown, notes)
        if p is not None and p.kind in TABLE_KINDS:
            outs.append(table(p, shown))
    changes = []
    for out in outs:
        found = _match(out, ins)
        if found is not None:
            changes.append(change(found[0], out, found[1]))
    return {
        "version": VERSION,
        "caps": {
            "full_bytes": CAPS.full_bytes,
            "head_bytes": CAPS.head_bytes,
            "time_s": CAPS.time_s,
            "distinct_values": CAPS.distinct,
            "files": MAX_FILES,
        },
        "summary": {
            "rows_in": _total(ins),
            "rows_out": _total(outs),
            "exact": all(t["exact"] for t in ins + outs),
        },
        "inputs": ins,
        "outputs": outs,
        "changes": changes,
        "network": net_audit(list(network)),
        "notes": notes,
    }


def net_audit(connections: list[NetConnection]) -> dict:
    """The job's connections (--allow-net): counted and summed, the first MAX_CONNECTIONS
    listed as the trace holds them."""
    allowed = [c for c in connections if c.allowed]
    return {
        "allowed": len(allowed),
        "refused": len(connections) - len(allowed),
        "sent": sum(c.sent for c in allowed),
        "received": sum(c.received for c in allowed),
        "connections": [c.to_json() for c in connections[:MAX_CONNECTIONS]],
    }


def _total(tables: list[dict]) -> int | None:
    counts = [t["rows"] for t in tables]
    return sum(counts) if counts and None not in counts else None


def write_audit(
    inputs: InputsLike,
    files: Iterable[str | Path],
    folder: Path,
    network: Iterable[NetConnection] = (),
) -> dict:
    """audit.json in `folder`, and its section appended to the folder's answer.md."""
    result = audit(inputs, files, folder, network)
    (folder / AUDIT).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    net = result["network"]
    if result["inputs"] or result["outputs"] or net["connections"]:  # no table: no empty section
        with open(folder / "answer.md", "a", encoding="utf-8") as f:
            f.write("\n" + markdown(result))
    return result


def _n(value: int | None, exact: bool = True) -> str:
    if value is None:
        return "?"
    return f"{value:,}" if exact else f"~{value:,}"


def markdown(result: dict) -> str:
    """The audit as a section of answer.md."""
    lines = ["## Audit", ""]
    for side, tables in (("Input", result["inputs"]), ("Output", result["outputs"])):
        for t in tables:
            dups = t["duplicate_rows"]
            lines.append(
                f"- {side} `{t['path']}`: {t['kind']}, {_n(t['rows'], t['exact'])} rows x "
                f"{len(t['columns'])} columns"
                + (
                    f", {'at least ' if t['duplicates_at_least'] else ''}{_n(dups)} duplicate rows"
                    if dups is not None
                    else ""
                )
            )
            for c in t["columns"]:
                more = "+" if c["distinct_at_least"] else ""
                lines.append(
                    f"  - `{c['name']}`: {c['dtype']}, {_n(c['nulls'])} null"
                    + ("" if c["nulls"] == 1 else "s")
                    + ", "
                    f"{_n(c['distinct'])}{more} distinct"
                )
            lines += [f"  - note: {n}" for n in t["notes"]]
    if not result["inputs"] and not result["outputs"]:
        lines.append("- No input or output tables.")
    for c in result["changes"]:
        parts = [f"rows {_n(c['rows_in'])} -> {_n(c['rows_out'])}"]
        if c["duplicates_removed"]:
            parts.append(f"{c['duplicates_removed']:,} duplicate rows removed")
        if c["columns_added"]:
            parts.append("added " + ", ".join(c["columns_added"]))
        if c["columns_removed"]:
            parts.append("removed " + ", ".join(c["columns_removed"]))
        parts += [f"{r['column']} {r['from']} -> {r['to']}" for r in c["columns_retyped"]]
        nulls = [
            f"{n} {_n(v['before']) if n not in c['columns_added'] else '(new)'} -> {_n(v['after'])}"
            for n, v in c["nulls"].items()
            if v["before"] != v["after"]
        ]
        if nulls:
            parts.append("nulls " + ", ".join(nulls))
        estimate = "" if c["exact"] else " (estimates: a file over the read cap)"
        lines.append(f"- `{c['input']}` -> `{c['output']}`{estimate}: " + "; ".join(parts))
    lines += _net_lines(result.get("network"))
    lines += [f"- note: {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def _net_lines(network: dict | None) -> list[str]:
    """The job's connections, when it made any: the totals, then each one."""
    if not network or not network["connections"]:
        return []
    made = network["allowed"]
    lines = [
        f"- Network: {made:,} connection{'' if made == 1 else 's'} ({network['sent']:,} bytes "
        f"sent, {network['received']:,} received), {network['refused']:,} refused"
    ]
    for record in network["connections"]:
        event = NetConnection.from_json({**record, "type": NetConnection.tag})
        lines.append(f"  - {event.line()}" if isinstance(event, NetConnection) else "  - ?")
    listed, made = len(network["connections"]), network["allowed"] + network["refused"]
    if made > listed:
        lines.append(f"  - and {made - listed:,} more")
    return lines
