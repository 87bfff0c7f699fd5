"""Makes tests/data/trace-v1/: a served session's trace written by the code before issue 22."""

# Run from the checkout of the commit before issue 22: PYTHONPATH=. python tests/data/trace-v1/make_fixture.py /tmp/out
import shutil
import sys
import time
from pathlib import Path

from sandcell.agent.model.scripted import ScriptedModel
from sandcell.agent.serve import ServeConfig
from sandcell.sandbox import Limits
from tests.serve_helpers import USERS, ask, client, execute, new_session, serving, upload

data = Path(sys.argv[1])
shutil.rmtree(data, ignore_errors=True)
csv = b"region,units\nEast,3\nWest,4\n"
replies = [
    {
        "content": "Let me look.",
        "tool_calls": [
            {
                "name": "python",
                "arguments": {
                    "code": "import pandas as pd\ndf = pd.read_csv('/data/sales.csv')\nprint(df.units.sum())\nopen('/workspace/output/total.txt', 'w').write(str(df.units.sum()))"
                },
            }
        ],
    },
    "Final Answer: 7 units",
    {"tool_calls": [{"name": "calculator", "arguments": {"expression": "7 * 2"}}]},
    "Final Answer: 14",
    "Final Answer: still 7",
]
model = ScriptedModel(replies, name="scripted")


def cfg(**kw):
    return ServeConfig(
        model=model,
        users=USERS,
        data=data,
        pool=0,
        limits=Limits(timeout_s=30),
        protocol="tools",
        **kw,
    )


with serving(cfg(idle_minutes=0.1)) as base, client(base) as api:
    sid = new_session(api)
    assert upload(api, sid, ("sales.csv", csv)).status_code == 201
    print(ask(api, sid, "How many units?")[-1])
    r = execute(api, sid, "x = df.units.max()\nx")
    print(r.json()["error"])
    deadline = time.time() + 30
    while api.get(f"/api/sessions/{sid}").json()["sandbox"] != "released":
        assert time.time() < deadline
        time.sleep(0.3)
    print(ask(api, sid, "Twice that?")[-1])
with serving(cfg()) as base, client(base) as api:
    print(execute(api, sid, 'import os\nsorted(os.listdir("/workspace/output"))').json()["error"])
    print(ask(api, sid, "Still there?")[-1])
print(sid)
