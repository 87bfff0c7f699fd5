"""OpenAIModel: any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp server)
through the `openai` client, with retries, streaming, usage and errors a user can act on."""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import time
from collections.abc import Callable

import openai

from agent.seams import (
    ModelError,
    OnToken,
    Reply,
    ToolCall,
    ToolsUnsupported,
    Usage,
    estimated_usage,
)

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
_TRANSIENT = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError)
_TOOL_WORDS = ("tool", "function")  # in a 400 body: the endpoint refused the tool definitions


class _BadBody(Exception):
    """The endpoint answered 200 with something that is not a chat completion."""


class OpenAIModel:
    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = 0.0,
        max_tokens: int | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        retry_base_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip(
            "/"
        )
        self.name = model or os.environ.get("SANDCELL_MODEL") or DEFAULT_MODEL
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key and self.base_url == DEFAULT_BASE_URL:
            raise ModelError(
                f"no API key for {self.base_url}: set OPENAI_API_KEY (or pass --api-key), "
                "or point OPENAI_BASE_URL at a local server (vLLM, Ollama, llama.cpp)"
            )
        self.temperature, self.max_tokens = temperature, max_tokens
        self.max_retries, self.retry_base_s, self._sleep = max_retries, retry_base_s, sleep
        # local servers ignore the key, but the client insists on one
        self.client = openai.OpenAI(
            base_url=self.base_url, api_key=key or "sk-local", timeout=timeout_s, max_retries=0
        )
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"OpenAIModel({self.name!r} at {self.base_url})"

    def complete(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_choice: str | None = None,
        stop: list[str] | None = None,
        on_token: OnToken | None = None,
    ) -> Reply:
        request: dict = {"model": self.name, "messages": messages}
        if tools:
            request["tools"] = tools
            if tool_choice:
                request["tool_choice"] = tool_choice
        if stop:
            request["stop"] = stop[:4]  # the API takes at most four
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_tokens:
            request["max_tokens"] = self.max_tokens
        started = time.monotonic()
        for attempt in range(self.max_retries + 1):
            try:
                reply = self._stream(request, on_token) if on_token else self._once(request)
            except (*_TRANSIENT, _BadBody) as exc:
                if attempt >= self._retries_for(exc):
                    raise ModelError(self._explain(exc, attempt + 1)) from None
                delay = self._delay(exc, attempt)
                log.warning(
                    "%s: %s; retry %d in %.1f s", self.base_url, _short(exc), attempt + 1, delay
                )
                self._sleep(delay)
                continue
            except openai.APIStatusError as exc:
                raise self._refused(exc, bool(tools)) from None
            if reply.usage.total == 0:
                written = len(reply.text) + sum(len(c.arguments) for c in reply.tool_calls)
                reply.usage = estimated_usage(messages, written)
            reply.duration_s, reply.retries = time.monotonic() - started, attempt
            return reply
        raise AssertionError("unreachable: the retry loop returns or raises")

    # -- one request -----------------------------------------------------------------------

    def _once(self, request: dict) -> Reply:
        try:
            resp = self.client.chat.completions.create(**request)
        except (json.JSONDecodeError, openai.APIResponseValidationError) as exc:
            raise _BadBody(f"the body is not chat-completion JSON: {exc}") from exc
        if isinstance(resp, str) or not getattr(resp, "choices", None):
            raise _BadBody(f"the body has no choices: {str(resp)[:200]!r}")
        choice = resp.choices[0]
        msg = choice.message
        calls = [
            ToolCall(c.id or f"call_{i}", c.function.name, c.function.arguments or "")
            for i, c in enumerate(msg.tool_calls or [])
        ]
        usage = Usage()
        if resp.usage:
            usage = Usage(resp.usage.prompt_tokens or 0, resp.usage.completion_tokens or 0)
        return Reply(
            _with_reasoning(msg, msg.content or ""), calls, choice.finish_reason or "stop", usage
        )

    def _stream(self, request: dict, on_token: OnToken) -> Reply:
        text: list[str] = []
        calls: dict[int, dict] = {}
        finish, usage = "stop", Usage()
        try:
            stream = self.client.chat.completions.create(
                **request, stream=True, stream_options={"include_usage": True}
            )
            for chunk in stream:
                if getattr(chunk, "usage", None):
                    usage = Usage(
                        chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0
                    )
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                delta = choice.delta
                if delta and delta.content:
                    text.append(delta.content)
                    on_token(delta.content)
                for tc in (delta.tool_calls or []) if delta else []:
                    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = tc.id or slot["id"]
                    if tc.function:
                        slot["name"] += tc.function.name or ""
                        slot["arguments"] += tc.function.arguments or ""
                finish = choice.finish_reason or finish
        except (json.JSONDecodeError, openai.APIResponseValidationError) as exc:
            raise _BadBody(f"a streamed chunk is not a chat-completion chunk: {exc}") from exc
        tool_calls = [
            ToolCall(s["id"] or f"call_{i}", s["name"], s["arguments"])
            for i, s in sorted(calls.items())
        ]
        return Reply("".join(text), tool_calls, finish, usage)

    # -- errors ----------------------------------------------------------------------------

    def _retries_for(self, exc: Exception) -> int:
        if isinstance(exc, openai.APIConnectionError) and not isinstance(
            exc, openai.APITimeoutError
        ):
            return min(self.max_retries, 2)  # a server that is down stays down: fail soon
        return self.max_retries

    def _delay(self, exc: Exception, attempt: int) -> float:
        response = getattr(exc, "response", None)
        after = response.headers.get("retry-after") if response is not None else None
        if after:
            try:
                return min(float(after), 60.0)
            except ValueError:
                when = email.utils.parsedate_to_datetime(after)
                return max(0.0, min(when.timestamp() - time.time(), 60.0))
        return self.retry_base_s * (2**attempt) * (1 + random.random() / 2)

    def _explain(self, exc: Exception, tries: int) -> str:
        where = f"the model endpoint {self.base_url}"
        if isinstance(exc, openai.APITimeoutError):
            return (
                f"{where} did not answer within {self.timeout_s:g} s ({tries} tries). Check that "
                "the server is not overloaded, or raise the request timeout."
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            return (
                f"cannot reach {where} ({type(cause).__name__}: {cause}; {tries} tries). Check "
                "that the server is running and that OPENAI_BASE_URL (or --base-url) points at "
                "it, usually ending in /v1."
            )
        if isinstance(exc, openai.RateLimitError):
            return f"{where} kept answering 429 Too Many Requests ({tries} tries). Wait, or check the account's quota."
        if isinstance(exc, openai.APIStatusError):
            return (
                f"{where} kept failing with HTTP {exc.status_code} ({tries} tries): {_short(exc)}"
            )
        return (
            f"{where} answered with something that is not an OpenAI chat completion ({tries} "
            f"tries): {_short(exc)}. Check that OPENAI_BASE_URL is an OpenAI-compatible /v1 URL."
        )

    def _refused(self, exc: openai.APIStatusError, had_tools: bool) -> ModelError:
        where, status = f"the model endpoint {self.base_url}", exc.status_code
        if status in (401, 403):
            return ModelError(
                f"{where} rejected the API key (HTTP {status}: {_short(exc)}). Check OPENAI_API_KEY "
                "(or --api-key) and that the key may use this model."
            )
        if status == 404:
            return ModelError(
                f"{where} answered 404 for model {self.name!r} ({_short(exc)}). Check SANDCELL_MODEL "
                "(or --model) and that OPENAI_BASE_URL ends in /v1."
            )
        body = str(exc).lower()
        if had_tools and status in (400, 422) and any(w in body for w in _TOOL_WORDS):
            return ToolsUnsupported(f"{where} does not accept tool definitions: {_short(exc)}")
        return ModelError(f"{where} refused the request (HTTP {status}): {_short(exc)}")


def _with_reasoning(msg: object, text: str) -> str:
    """Servers with a reasoning parser (vLLM, DeepSeek) return the thinking apart; keep it as a
    <think> block so the trace and the parser see one text."""
    reasoning = getattr(msg, "reasoning_content", None)
    return (
        f"<think>{reasoning}</think>\n{text}" if isinstance(reasoning, str) and reasoning else text
    )


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."
