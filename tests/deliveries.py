"""Deliveries of files from several vendors' families for the recipe-library tests: each
family's habits, the cells that clean them, a scripted model that answers each job as its
family needs, and hand-made library recipes."""

import json
import random
import re
from collections import Counter

import pandas as pd
import pandera.pandas as pa

from sandcell.agent.jobs.fingerprint import Layout

SAVE = "import os; os.makedirs('/workspace/output', exist_ok=True)\n"
SAVE += "df[['id', 'amount', 'region']].to_csv('/workspace/output/clean.csv', index=False)\n"
# Each family's own habits, and the cells that clean them (and no other family).
FAMILIES = {
    "A": ("id,amount,region", lambda i: [f"{i},{i}.5,N", f"{i},{i}.5,N", f"{i + 1},-2,S"],
          "import pandas as pd\ndf = pd.read_csv('{path}').drop_duplicates()\n"
          "df = df[df.amount >= 0]\n"),
    "B": ("ID;Amount;Region", lambda i: [f"{i};{i};S", f"{i + 1};3;N"],
          "import pandas as pd\ndf = pd.read_csv('{path}', sep=';')\n"
          "df.columns = [c.lower() for c in df.columns]\n"),
    # C and D share one layout: C repeats rows, D writes regions in lower case
    "C": ("id|amt|reg", lambda i: [f"{i}|{i}|N", f"{i}|{i}|N", f"{i + 1}|4|S"],
          "import pandas as pd\ndf = pd.read_csv('{path}', sep='|').drop_duplicates()\n"
          "df = df.rename(columns={{'amt': 'amount', 'reg': 'region'}})\n"),
    "D": ("id|amt|reg", lambda i: [f"{i}|{i}|n", f"{i + 1}|4|s"],
          "import pandas as pd\ndf = pd.read_csv('{path}', sep='|')\n"
          "df = df.rename(columns={{'amt': 'amount', 'reg': 'region'}})\n"
          "df['region'] = df.region.str.upper()\n"),
    "E": ("sku,qty,area", lambda i: [f"{i},{i},N"],
          "import pandas as pd\ndf = pd.read_csv('{path}')\n"
          "df = df.rename(columns={{'sku': 'id', 'qty': 'amount', 'area': 'region'}})\n"),
    "F": ("Item\tValue\tZone", lambda i: [f"{i}\t{i}\tS", f"{i + 1}\t0\tN"],
          "import pandas as pd\ndf = pd.read_csv('{path}', sep='\\t')\n"
          "df = df.rename(columns={{'Item': 'id', 'Value': 'amount', 'Zone': 'region'}})\n"),
}  # fmt: skip
RENAMED = {"amt": "amount", "reg": "region", "sku": "id", "qty": "amount", "area": "region",
           "Item": "id", "Value": "amount", "Zone": "region"}  # fmt: skip


def truth(path, family: str) -> pd.DataFrame:
    """What a file of the family must be cleaned into, worked out here on the host apart
    from the cells above."""
    sep = {"B": ";", "C": "|", "D": "|", "F": "\t"}.get(family, ",")
    df = pd.read_csv(path, sep=sep).rename(columns=lambda c: RENAMED.get(c, c.lower()))
    if family in "AC":
        df = df.drop_duplicates()
    if family == "A":
        df = df[df.amount >= 0]
    if family == "D":
        df["region"] = df.region.str.upper()
    return df[["id", "amount", "region"]].reset_index(drop=True)


# What every family's output must be: one row per id, no negative amount, region N or S.
SALES = pa.DataFrameSchema(
    {
        "id": pa.Column(int, unique=True),
        "amount": pa.Column(float, pa.Check.ge(0)),
        "region": pa.Column(str, pa.Check.isin(["N", "S"])),
    },
    strict=True,
    coerce=True,
)


def python(code: str) -> dict:
    return {"tool_calls": [{"name": "python", "arguments": {"code": code}}]}


class FamilyModel:
    """The scripted server's replies: each request answered as its job's family needs (the
    cleaning cell, then the final answer), counted per family."""

    def __init__(self, family_of: dict[str, str], delay: float = 0.0):
        self.family_of, self.delay = family_of, delay
        self.asked: Counter[str] = Counter()

    def __call__(self, body: dict) -> dict:
        messages = body["messages"]
        task = next(m["content"] for m in messages if m["role"] == "user")
        name = re.search(r"Clean (\w+\.csv)", task)[1]
        family = self.family_of[name]
        self.asked[family] += 1
        if messages[-1]["role"] == "tool":
            return {"delay": self.delay, "content": "Final Answer: cleaned."}
        code = FAMILIES[family][2].format(path=f"/data/{name}") + SAVE
        return {"delay": self.delay, **python(code)}


def delivery(folder, counts: dict[str, int], start: int = 1) -> dict[str, str]:
    """Files of each family under shuffled names (f<number>.csv, the numbers dealt out of
    family order), a schema and a jobs file: {file name: family}."""
    order = [family for family, n in counts.items() for _ in range(n)]
    random.Random(start).shuffle(order)  # the same shuffle each run
    family_of = {}
    for number, family in enumerate(order, start):
        name = f"f{number}.csv"
        header, rows, _ = FAMILIES[family]
        (folder / name).write_text("\n".join([header, *rows(number * 10)]) + "\n")
        family_of[name] = family
    (folder / "sales.yaml").write_text(SALES.to_yaml())
    lines = [
        json.dumps({"id": name[:-4], "task": f"Clean {name} into output/clean.csv",
                    "inputs": [name], "expect": {"output/clean.csv": "sales.yaml"}})
        for name in family_of
    ]  # fmt: skip
    (folder / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    return family_of


def library_recipe(
    folder, name: str, layout: Layout, cells: list[str], packages: list[str] | None = None
) -> None:
    installs = f"# packages: {json.dumps(packages)}\n" if packages else ""
    text = (
        "# sandcell recipe, made by hand\n"
        f"# fingerprint: {layout.to_json()}\n{installs}\n"
        "# %% tags=[\"parameters\"]\nINPUTS = ['/data/x.csv']\n\n"
        + "\n\n".join(f"# %%\n{cell}" for cell in cells)
        + "\n"
    )
    (folder / name).write_text(text)
