"""`make demo`: a data-cleaning job on a deliberately messy CSV that ships with sandcell.

Uses the endpoint in OPENAI_BASE_URL / OPENAI_API_KEY / SANDCELL_MODEL when set, else the
bundled scripted replies (a replay, and it says so). The sandbox is real either way."""

import argparse
import sys
from pathlib import Path

from sandcell.agent.cli import exits
from sandcell.agent.cli.console import EventPrinter
from sandcell.agent.cli.options import output_folder
from sandcell.agent.jobs.job_files import write_answer
from sandcell.agent.model.openai_model import OpenAIModel
from sandcell.agent.model.scripted import ScriptedModel
from sandcell.agent.model.settings import endpoint_in
from sandcell.agent.seams import Model
from sandcell.agent.session import Agent

DEMO = Path(__file__).parents[1] / "demo"  # agent/demo/: the data, package data of sandcell.agent
TASK = (
    "Clean /data/messy_sales.csv: it is not UTF-8, has mixed date formats, duplicate rows, "
    "amounts with thousands separators and missing values. Write the cleaned table as UTF-8 "
    "to /workspace/output/clean_sales.csv, save a chart of the amount per day to "
    "/workspace/output/amount_per_day.png, and summarise what you changed."
)


@exits.reported()
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("sandcell-out/demo"))
    args = parser.parse_args()
    model: Model
    if endpoint_in():
        model = OpenAIModel()
        print(f"model: {model.name} at {model.where}")
    else:
        model = ScriptedModel(DEMO / "clean_sales.json")
        print(
            "model: a replay of agent/demo/clean_sales.json (no OPENAI_BASE_URL set); "
            "the sandbox is real"
        )
    agent = Agent(model, on_event=EventPrinter(stream_tokens=False))
    output_folder(args.output, overwrite=True)  # each demo run replaces the last one's files
    result = agent.run(TASK, inputs=[DEMO / "messy_sales.csv"], output_dir=args.output)
    write_answer(result, args.output)
    print(f"\nstop reason: {result.stop_reason}; {result.steps} steps, {result.duration_s:.1f} s")
    for path in [args.output / n for n in ("answer.md", "trace.jsonl", "notebook.ipynb")]:
        print(f"  {path}")
    for path in result.files:
        print(f"  {path}")
    return exits.for_result(result)


if __name__ == "__main__":
    sys.exit(main())
