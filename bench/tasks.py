"""The scripted task set shared by the agent and batch benchmarks: questions on real CSVs
(tests/realdata.py), each 2-3 code steps then a final answer, written once and rendered in
each agent's format (sandcell tool calls, sandcell text ReAct, smolagents CodeAgent).

The last code step prints `RESULT=<value>`; the final reply is written from the observation
the agent sent (so a wrong computation gives a wrong answer), and the truth is computed
here with host pandas, independently of both agents."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tests.realdata import PENGUINS, VEGA

LOAD = "import pandas as pd\ndf = pd.read_csv(PATH)\nprint(df.shape)\nprint(df.head(3))"
LOOK = "I will load the file and look at its shape and first rows."
RESULT = re.compile(r"RESULT=([^\n]+)")


@dataclass(frozen=True)
class Task:
    id: str
    csv: Path
    question: str
    steps: tuple[tuple[str, str], ...]  # (thought, code); PATH stands for the file's path
    truth: Callable[[pd.DataFrame], object]  # the answer from host pandas

    def code(self, step: int, path: str) -> str:
        return self.steps[step][1].replace("PATH", repr(path))

    def expected(self) -> str:
        return answer_text(self.truth(pd.read_csv(self.csv)))

    def prompt(self, path: str) -> str:
        return f"{self.question} The data is in {path}."


def answer_text(value: object) -> str:
    return f"The answer is {value}."


def _task(id: str, csv: Path, question: str, truth: Callable, *steps: tuple[str, str]) -> Task:
    return Task(id, csv, question, ((LOOK, LOAD), *steps), truth)


def _dates(df: pd.DataFrame) -> pd.Series:
    return pd.to_datetime(df["date"])


TASKS: list[Task] = [
    _task("penguins-gentoo-mass", PENGUINS, "What is the mean body mass of Gentoo penguins, in g?",
          lambda d: round(float(d[d.species == "Gentoo"].body_mass_g.mean()), 1),
          ("Mean body mass per species, rounded.",
           ("m = df.groupby('species').body_mass_g.mean()\nprint(m)\n"
           "print(f\"RESULT={round(float(m['Gentoo']), 1)}\")"))),
    _task("penguins-adelie-island", PENGUINS, "On which island were the most Adelie penguins seen?",
          lambda d: d[d.species == "Adelie"].island.value_counts().idxmax(),
          ("Keep the Adelie rows.", "a = df[df.species == 'Adelie']\nprint(len(a))"),
          ("Count them per island.",
           "c = a.island.value_counts()\nprint(c)\nprint(f'RESULT={c.idxmax()}')")),
    _task("penguins-flipper-mass-corr", PENGUINS,
          "What is the correlation between flipper length and body mass?",
          lambda d: round(float(d.flipper_length_mm.corr(d.body_mass_g)), 3),
          ("Drop rows with missing measurements.",
           "m = df.dropna(subset=['flipper_length_mm', 'body_mass_g'])\nprint(len(m))"),
          ("Pearson correlation.",
           "r = m.flipper_length_mm.corr(m.body_mass_g)\nprint(f'RESULT={round(float(r), 3)}')")),
    _task("airports-top-state", VEGA / "airports.csv", "Which US state has the most airports?",
          lambda d: d.state.value_counts().idxmax(),
          ("Airports per state.",
           "c = df.state.value_counts()\nprint(c.head())\nprint(f'RESULT={c.idxmax()}')")),
    _task("iowa-top-source", VEGA / "iowa-electricity.csv",
          "Which source generated the most electricity in Iowa over all years?",
          lambda d: d.groupby("source").net_generation.sum().idxmax(),
          ("Total generation per source.",
           ("t = df.groupby('source').net_generation.sum()\nprint(t)\n"
           "print(f'RESULT={t.idxmax()}')"))),
    _task("la-riots-median-age", VEGA / "la-riots.csv",
          "What was the median age of the people who died in the LA riots?",
          lambda d: float(d.age.median()),
          ("Check the age column for missing values.", "print(df.age.isna().sum())"),
          ("The median age.", "print(f'RESULT={float(df.age.median())}')")),
    _task("seattle-temps-warmest-month", VEGA / "seattle-temps.csv",
          "Which month (1-12) had the highest mean temperature in Seattle in 2010?",
          lambda d: int(d.groupby(_dates(d).dt.month).temp.mean().idxmax()),
          ("Parse the dates.", "df['date'] = pd.to_datetime(df['date'])\nprint(df.date.min())"),
          ("Mean temperature per month.",
           ("m = df.groupby(df.date.dt.month).temp.mean()\nprint(m.round(1))\n"
           "print(f'RESULT={int(m.idxmax())}')"))),
    _task("seattle-rain-days-2014", VEGA / "seattle-weather.csv",
          "How many days of 2014 were recorded as rain in Seattle?",
          lambda d: int(((_dates(d).dt.year == 2014) & (d.weather == "rain")).sum()),
          ("Parse the dates.", "df['date'] = pd.to_datetime(df['date'])\nprint(df.date.max())"),
          ("Count the rainy days of 2014.",
           ("n = int(((df.date.dt.year == 2014) & (df.weather == 'rain')).sum())\n"
           "print(f'RESULT={n}')"))),
    _task("seattle-july-max", VEGA / "seattle-weather.csv",
          "What is the mean daily maximum temperature in Seattle in July, over all years?",
          lambda d: round(float(d[_dates(d).dt.month == 7].temp_max.mean()), 2),
          ("Keep the July days.",
           ("df['date'] = pd.to_datetime(df['date'])\njuly = df[df.date.dt.month == 7]\n"
           "print(len(july))")),
          ("Their mean maximum.", "print(f'RESULT={round(float(july.temp_max.mean()), 2)}')")),
    _task("sf-temps-max", VEGA / "sf-temps.csv",
          "What was the highest hourly temperature in San Francisco in 2010?",
          lambda d: float(d.temp.max()),
          ("The maximum.", "print(df.temp.describe())\nprint(f'RESULT={float(df.temp.max())}')")),
    _task("stocks-top-mean", VEGA / "stocks.csv", "Which stock had the highest mean price?",
          lambda d: d.groupby("symbol").price.mean().idxmax(),
          ("Mean price per symbol.",
           ("m = df.groupby('symbol').price.mean()\nprint(m.round(2))\n"
           "print(f'RESULT={m.idxmax()}')"))),
    _task("employment-best-month", VEGA / "us-employment.csv",
          "In which month did US nonfarm employment grow the most?",
          lambda d: d.month[d.nonfarm_change.idxmax()],
          ("The month with the largest change.",
           ("i = df.nonfarm_change.idxmax()\nprint(df.loc[i, ['month', 'nonfarm_change']])\n"
           "print(f\"RESULT={df.month[i]}\")"))),
]  # fmt: skip


def result_in(text: str) -> str:
    """The value the last code step printed, from an observation."""
    found = RESULT.findall(text)
    if not found:
        raise AssertionError(f"no RESULT= in the observation: {text[:300]!r}")
    return found[-1].strip()


def _text(message: dict) -> str:
    """A message's content as text: a string, or a list of parts."""
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return content


def last_text(body: dict) -> str:
    """The newest message of a chat-completion request, as text (an observation)."""
    return _text(body["messages"][-1])


def sandcell_script(task: Task, protocol: str) -> list:
    """Replies for the scripted server, as sandcell's `tools` or `react` protocol expects."""
    script: list = []
    for i, (thought, _) in enumerate(task.steps):
        code = task.code(i, f"/data/{task.csv.name}")
        if protocol == "react":
            script.append(f"Thought: {thought}\n```python\n{code}\n```")
        else:
            script.append({"content": thought, "tool_calls": [python_call(code)]})
    prefix = "Thought: I have the result.\nFinal Answer: " if protocol == "react" else ""
    script.append(lambda body: prefix + answer_text(result_in(last_text(body))))
    return script


def smolagents_script(task: Task, path: str) -> list:
    """The same steps in smolagents CodeAgent's format (Thought, then a <code> block; the
    answer is a final_answer() call)."""
    script: list = [
        f"Thought: {thought}\n<code>\n{task.code(i, path)}\n</code>"
        for i, (thought, _) in enumerate(task.steps)
    ]
    script.append(
        lambda body: (
            "Thought: I have the result.\n<code>\nfinal_answer("
            f"{json.dumps(answer_text(result_in(last_text(body))))})\n</code>"
        )
    )
    return script


def batch_script(task: Task) -> list:
    """Replies for a ScriptedModel (tool calls; the final answer is the host's truth)."""
    return [*sandcell_script(task, "tools")[:-1], task.expected()]


def python_call(code: str) -> dict:
    return {"name": "python", "arguments": {"code": code}}


def sent_chars(body: dict) -> int:
    """Characters one request sends the model: every message's text, the tool calls it
    replays (name and arguments), and the tool definitions if any."""
    total = 0
    for message in body.get("messages", []):
        total += len(_text(message))
        for call in message.get("tool_calls") or []:
            total += len(call["function"]["name"]) + len(call["function"]["arguments"])
    if body.get("tools"):
        total += len(json.dumps(body["tools"]))
    return total
