"""The model sees the charts its code made (--vision): image parts in the request after a chart
cell in both protocols, `auto` against servers that refuse images the way real ones do (one
retry without them, remembered, a warning and a trace event), `off`, and the context budget's
count of images. The real openai client over HTTP to the scripted server; the chart tests run a
real kernel in Docker, the others need none."""

import base64
import io
import json
import os

import pytest
from PIL import Image

from sandcell import Agent, OpenAIModel
from sandcell.agent import context
from sandcell.agent.records.trace import read_trace
from sandcell.agent.seams import ImagesUnsupported, ModelError
from sandcell.agent.vision import IMAGE_CHARS, MAX_IMAGES, MAX_SIDE, figures_message
from sandcell.sandbox.boundary import PATH_KEY
from sandcell.sandbox.execution import Execution, Result
from tests.cli_runner import sandcell
from tests.scripted_server import IMAGE_REFUSALS, ScriptedServer, image_parts

CHART = "import matplotlib.pyplot as plt\nplt.bar(['a', 'b', 'c'], [3, 1, 2])\nplt.show()\n"


def model(server: ScriptedServer) -> OpenAIModel:
    return OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)


def png(width: int, height: int) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "steelblue").save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def image_messages(body: dict) -> list[tuple[int, dict]]:
    return [(i, m) for i, m in enumerate(body["messages"]) if isinstance(m["content"], list)]


def urls(message: dict) -> list[str]:
    return [p["image_url"]["url"] for p in message["content"] if p["type"] == "image_url"]


def tool_chart_script() -> list:
    return [
        {"tool_calls": [{"name": "python", "arguments": {"code": CHART}}]},
        {"tool_calls": [{"name": "python", "arguments": {"code": CHART}}]},
        "The bars are a=3, b=1, c=2.",
    ]


# -- on: the chart reaches the model, in both protocols -------------------------------------------


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_vision_on_sends_the_chart_after_the_tool_result(tmp_path):
    with ScriptedServer(tool_chart_script()[1:]) as server:
        result = Agent(model(server), protocol="tools", vision="on").run("Chart it", (), tmp_path)
    assert result.answered, result
    body = server.requests[1]
    [(at, message)] = image_messages(body)
    # a tool message cannot hold images: a user message right after the tool result does
    assert body["messages"][at - 1]["role"] == "tool"
    assert message["role"] == "user" and "figures/" in message["content"][0]["text"]
    [url] = urls(message)
    assert url.startswith("data:image/png;base64,")
    with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as image:
        assert image.format == "PNG" and max(image.size) <= MAX_SIDE


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_vision_on_sends_the_chart_after_the_observation_in_text_react(tmp_path):
    script = [
        f"Thought: a chart.\n```python\n{CHART}```",
        "Thought: done.\nFinal Answer: a=3 is the tallest bar.",
    ]
    with ScriptedServer(script) as server:
        agent = Agent(model(server), protocol="react", vision="on")
        result = agent.run("Chart it", (), tmp_path)
    assert result.answered, result
    body = server.requests[1]
    [(at, message)] = image_messages(body)
    # in the observation itself: two user messages in a row break alternating chat templates
    assert at == len(body["messages"]) - 1 and body["messages"][at - 1]["role"] == "assistant"
    assert message["content"][0]["text"].startswith("Observation:")
    assert "figures/" in message["content"][1]["text"]
    assert len(urls(message)) == 1 and image_parts(body) == 1


# -- auto: a server that refuses images -----------------------------------------------------------


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_vision_auto_sends_again_without_images_once_and_remembers(tmp_path):
    with ScriptedServer(tool_chart_script(), reject_images="ollama") as server:
        result = Agent(model(server), protocol="tools").run("Chart it", (), tmp_path)
    assert result.answered, result
    with_images = [image_parts(body) for body in server.requests]
    # the chart's request refused (once, though Ollama's status is a 500), sent again without
    # it; the second chart is never sent
    assert with_images == [0, 1, 0, 0], with_images
    assert len(server.requests) == 4
    second_chart = server.requests[3]["messages"]
    assert "figures/" in json.dumps(second_chart[-1]["content"])  # the tool result names it
    assert any("takes no images" in w for w in result.warnings), result.warnings
    [event] = [e for e in read_trace(tmp_path / "trace.jsonl") if e["type"] == "vision"]
    assert event["images"] == 1 and "missing data required for image input" in event["reason"]


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_vision_off_sends_no_image(tmp_path):
    with ScriptedServer(tool_chart_script()) as server:
        result = Agent(model(server), protocol="tools", vision="off").run("Chart", (), tmp_path)
    assert result.answered, result
    assert [image_parts(body) for body in server.requests] == [0, 0, 0]
    assert (
        "image image/png saved to /workspace/figures/"
        in server.requests[1]["messages"][-1]["content"]
    )


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_vision_flag_and_env_reach_the_run(tmp_path):
    """`sandcell run --vision off` and SANDCELL_VISION=on, through the real CLI."""
    for how, env, expected in ((["--vision", "off"], {}, 0), ([], {"SANDCELL_VISION": "on"}, 1)):
        script = tool_chart_script()[1:]
        with ScriptedServer(script) as server:
            out = tmp_path / f"out{expected}"
            args = ["run", "--task", "Chart", "--base-url", server.url, "--api-key", "k"]
            args += ["--model", "m", "--protocol", "tools", "--output", str(out), *how]
            done = sandcell(*args, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
        assert image_parts(server.requests[1]) == expected


# -- the endpoints' refusals (no Docker) ------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(IMAGE_REFUSALS))
def test_each_servers_refusal_is_told_apart_and_not_retried(kind):
    messages = [
        {"role": "user", "content": "Chart it"},
        {"role": "user", "content": [{"type": "text", "text": "the figure"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png(8, 8)}}]},
    ]  # fmt: skip
    with ScriptedServer(["never used"], reject_images=kind) as server:
        with pytest.raises(ImagesUnsupported, match="--vision off"):
            model(server).complete(messages)
        assert len(server.requests) == 1  # a refusal, not a passing failure: not retried
        # without images the same server answers
        assert model(server).complete(messages[:1]).text == "never used"


@pytest.mark.timeout(60)
def test_a_plain_server_error_with_images_is_not_taken_for_a_refusal():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png(8, 8)}}
    messages = [{"role": "user", "content": [image]}]
    refusal = [{"error": 400, "message": "bad temperature"}]
    with ScriptedServer(refusal) as server, pytest.raises(ModelError) as got:
        model(server).complete(messages)
    assert not isinstance(got.value, ImagesUnsupported)


# -- figures and the budget (no Docker) -------------------------------------------------------


def chart_execution(n: int, width: int = 1600, height: int = 1200) -> Execution:
    results = [
        Result({"image/png": png(width, height), "text/plain": "<Figure>"}, {PATH_KEY: f"figures/{i}.png"})
        for i in range(n)
    ]  # fmt: skip
    results.append(Result({"image/svg+xml": "<svg/>"}, {PATH_KEY: "figures/v.svg"}))
    results.append(Result({"image/png": "bm90IGEgcG5n"}, {PATH_KEY: "figures/broken.png"}))
    return Execution(code="", results=results)


def test_figures_are_downscaled_capped_and_the_rest_named():
    message = figures_message([chart_execution(MAX_IMAGES + 1)])
    shown = urls(message)
    assert len(shown) == MAX_IMAGES
    for url in shown:
        with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as image:
            assert image.size == (MAX_SIDE, MAX_SIDE * 3 // 4)
    text = message["content"][0]["text"]
    for name in (f"figures/{MAX_IMAGES}.png", "figures/v.svg", "figures/broken.png"):
        assert name in text.split("Not shown here")[1]
    assert figures_message([Execution(code="print(1)")]) is None


def test_the_budget_counts_each_image_as_a_fixed_estimate_and_drops_old_ones_first():
    def history() -> list[dict]:
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
        for i in range(4):
            messages += [
                {"role": "assistant", "content": f"step {i}"},
                {"role": "user", "content": f"Observation: {'x' * 500}"},
                figures_message([chart_execution(1, 64, 48)]),
            ]
        return messages

    messages = history()
    text = sum(len(context.text_of(m)) for m in messages)
    assert context.size(messages) == text + 4 * IMAGE_CHARS  # not the data URLs' length
    # room for two images: the two oldest are dropped, every observation stays whole
    compacted = context.fit(messages, text + 2 * IMAGE_CHARS + 200, keep_recent=3)
    assert compacted == 2
    left = [sum(1 for p in m["content"] if p["type"] == "image_url")
            for m in messages if isinstance(m["content"], list)]  # fmt: skip
    assert left == [1, 1]
    assert "dropped" in messages[4]["content"] and "figures/0.png" in messages[4]["content"]
    assert all("x" * 500 in m["content"] for m in messages if "Observation" in context.text_of(m))
    # the newest figures stay even when the budget has no room for them
    messages = history()
    context.fit(messages, 10, keep_recent=1)
    assert sum(isinstance(m["content"], list) for m in messages) == 1
    assert isinstance(messages[-1]["content"], list)
