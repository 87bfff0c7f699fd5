"""The text ReAct parser and the tools protocol, on replies shaped like real models' replies
(GPT-style labels, Qwen/DeepSeek Chinese labels and <think> blocks, Hermes <tool_call> tags,
Llama-style call syntax), including the broken ones."""

import json

import pytest

from sandcell.agent.parsing import parse_react
from sandcell.agent.protocols import REACT_STOP, ReactProtocol, ToolsProtocol
from sandcell.agent.seams import FormatError, Reply, ToolCall
from sandcell.tools import Registry, calculator_tool
from sandcell.tools.registry import Tool

TOOLS = {"python": "code", "calculator": "expression", "file_metadata": "path"}


def one(text):
    parsed, cut = parse_react(text, TOOLS)
    assert parsed.answer is None, parsed
    assert len(parsed.actions) == 1
    return parsed.actions[0], parsed, cut


# -- labels ------------------------------------------------------------------------------------


def test_english_labels_with_json_input_and_invented_observation_cut():
    reply = (
        "Thought: I should load the file and look at its columns first.\n"
        "Action: python\n"
        'Action Input: {"code": "import pandas as pd\\ndf = pd.read_csv(\'/data/sales.csv\')\\n'
        'print(df.dtypes)"}\n'
        "Observation: date object\nsales int64\n"
        "Thought: Now I know the columns.\nFinal Answer: The file has two columns."
    )
    action, parsed, cut = one(reply)
    assert action.tool == "python" and action.how == "label"
    assert json.loads(action.args)["code"].startswith("import pandas as pd\ndf = pd.read_csv(")
    assert parsed.thought == "I should load the file and look at its columns first."
    assert cut.startswith("Observation: date object") and "Final Answer" in cut


def test_chinese_labels_and_full_width_colons():
    reply = '思考：我需要计算总和。\n行动：calculator\n行动输入：{"expression": "1200 + 300"}\n观察：1500'
    action, parsed, cut = one(reply)
    assert (action.tool, json.loads(action.args)) == ("calculator", {"expression": "1200 + 300"})
    assert parsed.thought == "我需要计算总和。"
    assert cut == "观察：1500"


def test_chinese_final_answer():
    parsed, _ = parse_react(
        "思考：结果已经清楚了。\n最终答案：奥斯陆的销售额最高，共 1,500 件。", TOOLS
    )
    assert parsed.answer == "奥斯陆的销售额最高，共 1,500 件。"
    assert parsed.actions == []


def test_full_width_json_punctuation_is_normalised():
    action, _, _ = one('Action：calculator\nAction Input：｛"expression"："2+3"｝')
    assert json.loads(action.args) == {"expression": "2+3"}


def test_markdown_bold_labels_and_bare_code_input():
    action, parsed, _ = one(
        "**Thought:** check the shape\n**Action:** python\n**Action Input:** print(df.shape)"
    )
    assert action.args == {"code": "print(df.shape)"}
    assert parsed.thought == "check the shape"


@pytest.mark.parametrize(
    "reply",
    ["Final Answer: **East** sold most", "**Final Answer:** **East** sold most",
     "**Final Answer**: **East** sold most", "__Final Answer:__ **East** sold most"],
)  # fmt: skip
def test_an_answer_that_starts_with_markdown_emphasis_keeps_it(reply):
    parsed, _ = parse_react(reply, TOOLS)
    assert parsed.answer == "**East** sold most"


def test_fenced_code_as_action_input():
    reply = "Thought: x\nAction: python\nAction Input:\n```python\nprint('hi')\nx = 1\n```\nObservation: hi"
    action, _, cut = one(reply)
    assert action.args == {"code": "print('hi')\nx = 1"}
    assert cut == "Observation: hi"


def test_action_without_input_uses_the_following_code_block():
    action, _, _ = one("Thought: run it\nAction: python\n```python\nprint(2 + 2)\n```")
    assert action.args == {"code": "print(2 + 2)"}


def test_broken_json_input_is_left_for_the_registry_to_repair():
    action, _, _ = one('Thought: add\nAction: calculator\nAction Input: {"expression": "2+3",')
    assert action.args == '{"expression": "2+3",'
    obs = Registry([calculator_tool]).call(action.tool, action.args)
    assert obs.ok and obs.text.strip() == "5"


def test_action_before_a_hallucinated_final_answer_wins():
    action, _, cut = one(
        'Action: calculator\nAction Input: {"expression": "6*7"}\nFinal Answer: 42'
    )
    assert action.tool == "calculator"
    assert cut == "Final Answer: 42"


def test_final_answer_may_quote_code_without_running_it():
    parsed, _ = parse_react(
        "Thought: done\nFinal Answer: I used\n```python\ndf.sum()\n```\nTotal: 3", TOOLS
    )
    assert parsed.answer.startswith("I used") and parsed.answer.endswith("Total: 3")


def test_think_block_is_a_thought_not_an_answer():
    reply = "<think>The user wants the mean. Final Answer: maybe 3?</think>\nThought: compute\n```python\nprint(df.x.mean())\n```"
    action, parsed, _ = one(reply)
    assert action.args == {"code": "print(df.x.mean())"}
    assert parsed.thought.startswith("The user wants the mean")


# -- code blocks, JSON blocks, call style ----------------------------------------------------------


def test_python_block_without_labels_cuts_the_invented_observation():
    reply = (
        "Let me look at the data.\n\n```python\nimport pandas as pd\ndf = pd.read_csv('/data/s.csv')\n"
        "df.head()\n```\nObservation:\n   a  b\n0  1  2\n\nFinal Answer: a and b"
    )
    action, parsed, cut = one(reply)
    assert action.how == "python_block"
    assert action.args["code"].endswith("df.head()")
    assert parsed.thought == "Let me look at the data."
    assert cut.startswith("Observation:")


def test_untagged_block_of_output_is_not_run():
    with pytest.raises(FormatError):
        parse_react("The result was:\n```\n   a  b\n0  1  2\n```", TOOLS)


def test_json_tool_block():
    reply = 'Thought: use the calculator\n```json\n{"tool": "calculator", "args": {"expression": "17*3"}}\n```'
    action, _, _ = one(reply)
    assert (action.tool, action.args, action.how) == (
        "calculator",
        {"expression": "17*3"},
        "json_block",
    )


def test_json_block_with_name_and_string_arguments_and_trailing_comma():
    reply = '```json\n{"name": "file_metadata", "arguments": {"path": "/data/s.csv"},}\n```'
    action, _, _ = one(reply)
    assert (action.tool, action.args) == ("file_metadata", {"path": "/data/s.csv"})


def test_hermes_tool_call_tags():
    action, _, _ = one(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    )
    assert (action.tool, action.args) == ("calculator", {"expression": "1+1"})


@pytest.mark.parametrize(
    ("reply", "args"),
    [
        ('calculator("17 * 3")', {"expression": "17 * 3"}),
        ("Action: calculator(expression='2**10')", {"expression": "2**10"}),
        ("Action: calculator(2*(3+4))\nObservation: 14", {"expression": "2*(3+4)"}),
        ('calculator({"expression": "9/3"})', {"expression": "9/3"}),
        ("Thought: sum\ncalculator（1200+300）", {"expression": "1200+300"}),
    ],
)
def test_call_style(reply, args):
    action, _, _ = one(reply)
    assert (action.tool, action.args, action.how) == ("calculator", args, "call")


def test_call_style_with_multiline_python_string():
    action, _, _ = one("Thought: list inputs\npython(\"import os\\nprint(os.listdir('/data'))\")")
    assert action.args == {"code": "import os\nprint(os.listdir('/data'))"}


def test_calls_of_unknown_names_are_not_actions():
    with pytest.raises(FormatError):
        parse_react("You could print(df.head()) to see it.", TOOLS)


# -- broken replies --------------------------------------------------------------------------------


def test_plain_prose_is_a_format_error_carrying_the_prose():
    with pytest.raises(FormatError) as err:
        parse_react("The average sale is 750.", TOOLS)
    assert "Final Answer:" in str(err.value)
    assert err.value.text == "The average sale is 750."


def test_empty_reply():
    with pytest.raises(FormatError, match="empty"):
        parse_react("  \n", TOOLS)


def test_action_without_any_input_says_what_to_write():
    with pytest.raises(FormatError, match="Action Input"):
        parse_react("Thought: compute\nAction: calculator\nObservation: 3", TOOLS)


def test_unknown_tool_is_passed_on_and_the_registry_lists_the_real_ones():
    action, _, _ = one('Action: web_search\nAction Input: {"query": "x"}')
    registry = Registry([calculator_tool])
    obs = registry.call(action.tool, action.args)
    assert not obs.ok and "calculator" in obs.text and "web_search" in obs.text


def test_unrepairable_arguments_become_an_exact_observation():
    scale = Tool(
        "scale",
        "multiply",
        {
            "type": "object",
            "properties": {"x": {"type": "number"}, "by": {"type": "number"}},
            "required": ["x", "by"],
        },
        lambda x, by: str(x * by),
    )
    action, _, _ = (
        parse_react("Action: scale\nAction Input: x=3; by=#", {"scale": None})[0].actions[0],
        0,
        0,
    )
    obs = Registry([scale]).call(action.tool, action.args)
    assert not obs.ok and "JSON" in obs.text and "scale" in obs.text
    # a one-string-argument tool gets the text itself, and says what it could not read
    action, _, _ = one("Action: calculator\nAction Input: {{{")
    obs = Registry([calculator_tool]).call(action.tool, action.args)
    assert not obs.ok and "{{{" in obs.text


# -- the protocols -------------------------------------------------------------------------------


def _registry():
    py = Tool(
        "python",
        "run code",
        {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        lambda code: code,
    )
    return Registry([py, calculator_tool])


def test_tools_protocol_several_calls_in_order_and_history_messages():
    proto, reg = ToolsProtocol(), _registry()
    reply = Reply(
        "",
        [
            ToolCall("c1", "calculator", '{"expression": "1+1"}'),
            ToolCall("c2", "python", '{"code": "x"'),
        ],
    )
    parsed, _ = proto.parse(reply, reg)
    assert [(a.tool, a.call_id) for a in parsed.actions] == [("calculator", "c1"), ("python", "c2")]
    msg = proto.assistant_message(reply, "")
    assert json.loads(msg["tool_calls"][1]["function"]["arguments"]) == {
        "code": "x"
    }  # stored repaired
    obs = proto.observation_messages(parsed.actions, ["2", "x"])
    assert obs == [
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
        {"role": "tool", "tool_call_id": "c2", "content": "x"},
    ]


def test_tools_protocol_text_reply_is_the_answer_unless_it_is_code_to_run():
    proto, reg = ToolsProtocol(), _registry()
    parsed, _ = proto.parse(Reply("The total is 1,500."), reg)
    assert parsed.answer == "The total is 1,500."
    parsed, _ = proto.parse(Reply("Let me check.\n```python\nprint(1)\n```"), reg)
    assert parsed.actions[0].args == {"code": "print(1)"}
    parsed, _ = proto.parse(Reply("I ran:\n```python\nprint(1)\n```\nand the total is 3."), reg)
    assert parsed.answer is not None


def test_react_protocol_request_and_history():
    proto, reg = ReactProtocol(), _registry()
    assert proto.request(reg) == {"tools": None, "stop": REACT_STOP}
    assert "Action Input" in proto.instructions(reg) and "calculator" in proto.instructions(reg)
    text = '<think>hmm</think>Thought: t\nAction: calculator\nAction Input: {"expression": "2"}\nObservation: 2'
    parsed, cut = proto.parse(Reply(text), reg)
    msg = proto.assistant_message(Reply(text), cut)
    assert msg["content"].startswith("Thought: t") and "Observation" not in msg["content"]
    assert proto.observation_messages(parsed.actions, ["2"]) == [
        {"role": "user", "content": "Observation: 2"}
    ]
