"""One reply put together from what an OpenAI-compatible endpoint sent: streamed chunks, or
an unstreamed message taken as one chunk (agent.model.openai_model sends the requests)."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

from sandcell.agent.seams import OnToken, Reply, ToolCall, Usage

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionChunk
    from openai.types.chat.chat_completion import Choice
    from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall
    from openai.types.completion_usage import CompletionUsage


class Assembly:
    """One streamed reply put together chunk by chunk, as the endpoint would have sent it
    whole; on_token sees the same text the Reply holds."""

    def __init__(self, on_token: OnToken | None):
        self.on_token = on_token
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish: str | None = None  # every OpenAI-compatible server ends with one
        self.usage = Usage()
        self.chunks = 0  # chunks that carried tokens (text, thinking or a tool call)
        self.chars = 0
        self.seen_choice = False

    def add(self, chunk: ChatCompletionChunk | Delta) -> None:
        usage = getattr(chunk, "usage", None)
        if usage:
            self.usage = Usage(usage.prompt_tokens or 0, usage.completion_tokens or 0)
        if not getattr(chunk, "choices", None):
            return
        self.seen_choice = True
        choice = chunk.choices[0]
        self.finish = choice.finish_reason or self.finish
        delta = choice.delta
        if not delta:
            return
        before = self.chars
        # servers with a reasoning parser (vLLM, llama.cpp, DeepSeek) send the thinking apart:
        # it is kept as a <think> block so the trace and the parser see one text
        thinking = getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None)
        if isinstance(thinking, str) and thinking:
            self._say(("" if self.reasoning else "<think>") + thinking)
            self.reasoning.append(thinking)
            self.chars += len(thinking)
        if delta.content:
            if self.reasoning and not self.text:
                self._say("</think>\n")
            self._say(delta.content)
            self.text.append(delta.content)
            self.chars += len(delta.content)
        for tc in delta.tool_calls or []:
            slot = self.calls.setdefault(self._index(tc), {"id": "", "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            if tc.function:
                name, arguments = tc.function.name or "", tc.function.arguments or ""
                if name != slot["name"]:  # some servers repeat the whole name in every chunk
                    slot["name"] += name
                slot["arguments"] += arguments
                self.chars += len(name) + len(arguments)
        self.chunks += self.chars > before or bool(delta.tool_calls)

    def add_message(self, choice: Choice, usage: CompletionUsage | None) -> None:
        """An unstreamed reply, taken as one big chunk: on_token sees it all at once."""
        message = choice.message
        calls = [
            Delta(index=i, id=c.id, function=c.function)
            for i, c in enumerate(getattr(message, "tool_calls", None) or [])
        ]
        delta = Delta(
            content=message.content,
            reasoning_content=getattr(message, "reasoning_content", None),
            tool_calls=calls,
        )
        self.add(
            Delta(choices=[Delta(delta=delta, finish_reason=choice.finish_reason)], usage=usage)
        )

    def _index(self, tc: ChoiceDeltaToolCall | Delta) -> int:
        if isinstance(tc.index, int):
            return tc.index
        last = max(self.calls, default=-1)  # no index: a new id starts the next call
        if last < 0 or (tc.id and tc.id != self.calls[last]["id"]):
            return last + 1
        return last

    def _say(self, text: str) -> None:
        if self.on_token:
            self.on_token(text)

    def reply(self) -> Reply:
        text = "".join(self.text)
        if self.reasoning:
            if not self.text:
                self._say("</think>\n")
            text = f"<think>{''.join(self.reasoning)}</think>\n{text}"
        calls = [
            ToolCall(s["id"] or f"call_{i}", s["name"], s["arguments"])
            for i, s in sorted(self.calls.items())
        ]
        return Reply(text, calls, self.finish or "stop", self.usage)

    def tail(self, n: int = 80) -> str:
        """The last of what arrived, for an error message."""
        arrived = "".join(self.reasoning) + "".join(self.text)
        arrived += "".join(f" {s['name']}({s['arguments']}" for _, s in sorted(self.calls.items()))
        return arrived if len(arrived) <= n else "..." + arrived[-(n - 3) :]


class Delta(types.SimpleNamespace):
    """An unstreamed reply's parts dressed as a chunk, so one assembly serves both."""

    def __getattr__(self, name: str) -> None:
        return None
