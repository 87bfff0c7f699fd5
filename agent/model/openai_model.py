"""OpenAIModel: any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp server)
through the `openai` client, with retries, streaming, usage and errors a user can act on.

Every reply is streamed, with or without an on_token callback (unstreamed only where a server
cannot stream it, below): the read timeout then holds between chunks, not for the whole reply,
so a slow server that keeps sending never trips it. The caller's deadline (the question's
wall time) and its cancel hold for the whole request instead: a timer shuts the response down
then, whatever the server sends or withholds (agent.model.deadline), and a retry that would start
after the deadline is not waited for. Messages name the endpoint without the credentials its
URL may carry (agent.model.redact).
Each reply is capped (max_tokens, 4096 unless --max-tokens or SANDCELL_MAX_TOKENS say, resolved
once with the other settings by agent.model.settings), so a local model that never stops still
ends. 429, 5xx and connection errors are retried (agent.model.retry) until the first token arrives; a timeout is
not (the server may still be working on the request), and a reply that stops mid-way is one
clear error, not a retry queued behind a server still busy with the first request.

What real servers do unlike the OpenAI API, and what is done about it here (each has a test in
tests/test_agent_models.py, and tests/test_realmodel.py runs llama-cpp-python's server):
- tools sent without tool_choice are ignored by llama-cpp-python's chatml-function-calling
  format: tool_choice "auto" is always sent with tools (OpenAI's default anyway);
- a tool_choice an endpoint refuses ("required" on older vLLM and on llama-cpp-python, which
  fails it with an empty HTTP 500) is dropped, once, and not sent again;
- llama-cpp-python answers an error in a streamed request (context too long, a tool call it
  cannot stream) by closing the connection before any chunk (after its 200, or with no response
  at all): that request is sent once more unstreamed, which gets the real error or the reply
  (a read timeout of an unstreamed request is not retried: nothing says the server is done);
- an assistant message with tool calls and null content is refused (HTTP 500, pydantic
  "validation errors"): it is sent with content "", and such a 500 is not retried;
- max_tokens ignored (llama-cpp-python's chatml-function-calling with tool_choice "auto"): a
  streamed reply is cut once it has sent more chunks than max_tokens allows; an unstreamed
  one is bounded by the caller's deadline (the question's wall time);
- no usage in streamed replies (stream_options ignored): usage is then estimated, and marked;
- a model without image input refuses image parts each server its own way (agent.vision's
  REFUSALS; Ollama and llama-server with a 500, not retried): ImagesUnsupported."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeGuard

import openai

from sandcell.agent.model import retry
from sandcell.agent.model.assembly import Assembly
from sandcell.agent.model.deadline import RequestDeadline
from sandcell.agent.model.endpoint_errors import closed, invalid, no_response, refuses_choice, short
from sandcell.agent.model.redact import scrub
from sandcell.agent.model.settings import API_KEY_ENV, BASE_URL_ENV, DEFAULT_BASE_URL, ModelSettings
from sandcell.agent.seams import (
    CANCELLED,
    ImagesUnsupported,
    LimitReached,
    ModelAttempt,
    ModelError,
    OnAttempt,
    OnToken,
    Reply,
    ToolsUnsupported,
    estimated_usage,
)
from sandcell.agent.vision import image_count
from sandcell.agent.vision import refused as refuses_images

log = logging.getLogger(__name__)

_TOOL_WORDS = ("tool", "function")  # in a 400 body: the endpoint refused the tool definitions
# the streamed request's usage option (unpacked into each request, never changed)
_INCLUDE_USAGE: dict[str, Any] = {"stream_options": {"include_usage": True}}


class _BadBody(Exception):
    """The endpoint answered 200 with something that is not a chat completion."""


class _Dropped(Exception):
    """The endpoint closed a streamed request before any chunk, with no response or after its
    200 (llama-cpp-python's way of reporting any error in one): it is no longer busy."""


class _Broken(Exception):
    """The reply stopped after tokens had arrived; the message says what arrived. Not retried."""


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
        """The Python API: each argument not given is taken from the environment
        (ModelSettings.from_env), else its default."""
        settings = ModelSettings.from_env(
            name=model,
            base_url=base_url,
            api_key=api_key,
            max_tokens=max_tokens,
            temperature=temperature,
            timeout_s=timeout_s,
            max_retries=max_retries,
            retry_base_s=retry_base_s,
        )
        self._start(settings, sleep)

    @classmethod
    def from_settings(
        cls, settings: ModelSettings, sleep: Callable[[float], None] = time.sleep
    ) -> OpenAIModel:
        """A client for settings resolved already (the CLI's, a Ray node's): the environment
        is not read again."""
        model = cls.__new__(cls)
        model._start(settings, sleep)
        return model

    def _start(self, settings: ModelSettings, sleep: Callable[[float], None]) -> None:
        self.settings = settings
        self.base_url, self.name = settings.base_url, settings.name
        self.where = settings.where  # what messages show: no credentials
        if not settings.api_key and self.base_url == DEFAULT_BASE_URL:
            raise ModelError(
                f"no API key for {self.where}: set {API_KEY_ENV} (or pass --api-key), "
                f"or point {BASE_URL_ENV} at a local server (vLLM, Ollama, llama.cpp)"
            )
        self.temperature, self.max_tokens = settings.temperature, settings.max_tokens
        self._cap = "max_tokens"  # "max_completion_tokens" once the endpoint asks for it
        self._usage_option = True  # stream_options.include_usage, until the endpoint refuses it
        self._refused_choices: set[str] = set()  # tool_choice values the endpoint refused
        self.max_retries, self.retry_base_s = settings.max_retries, settings.retry_base_s
        self._sleep, self.timeout_s = sleep, settings.timeout_s
        self._key = settings.api_key or "sk-local"  # local servers ignore the key
        self.client = self._new_client()

    def _new_client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.base_url, api_key=self._key, timeout=self.timeout_s, max_retries=0
        )

    def __repr__(self) -> str:
        return f"OpenAIModel({self.name!r} at {self.where})"

    def complete(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_choice: str | None = None,
        stop: list[str] | None = None,
        on_token: OnToken | None = None,
        deadline: float | None = None,
        cancelled: Callable[[], bool] | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> Reply:
        request = self._request(messages, tools, tool_choice, stop)
        images = sum(image_count(m) for m in messages)
        started = time.monotonic()
        for attempt in range(self.max_retries + 1):
            try:
                sent = (request, on_token, deadline, cancelled)
                reply = self._attempt(sent, messages, attempt, on_attempt)
            except _Broken as exc:
                raise ModelError(str(exc)) from None
            except (*retry.TRANSIENT, _BadBody) as exc:
                # sent again, it would be refused again (Ollama and llama-server refuse images
                # with a 500)
                if invalid(exc) or _images_refused(exc, images):
                    raise self._refused(exc, bool(tools), images) from None
                if attempt >= retry.retries_for(exc, self.max_retries):
                    raise ModelError(self._explain(exc, attempt + 1)) from None
                delay = retry.delay_s(exc, attempt, self.retry_base_s)
                if deadline is not None and time.monotonic() + delay >= deadline:
                    raise ModelError(
                        f"{self._explain(exc, attempt + 1)} No retry: the question's wall time "
                        f"comes before it (in {max(0.0, deadline - time.monotonic()):.1f} s)."
                    ) from None
                log.warning(
                    "%s: %s; retry %d in %.1f s", self.where, self._said(exc), attempt + 1, delay
                )
                self._sleep(delay)
                continue
            except openai.APIStatusError as exc:
                raise self._refused(exc, bool(tools), images) from None
            except openai.APIError as exc:  # an error event in the stream, before any token
                raise ModelError(
                    f"the model endpoint {self.where} sent an error instead of a reply: "
                    f"{self._said(exc)}"
                ) from None
            reply.duration_s, reply.retries = time.monotonic() - started, attempt
            return reply
        raise AssertionError("unreachable: the retry loop returns or raises")

    def _attempt(
        self, sent: tuple, messages: list[dict], number: int, report: OnAttempt | None
    ) -> Reply:
        """One request (`sent`: _send's arguments), its usage estimated where the endpoint
        gave none; `report` hears how it went, answered or not."""
        at, begun = time.time(), time.monotonic()
        try:
            reply = self._send(*sent)
        except BaseException as exc:  # said, then handled by the caller
            if report is not None:
                cancelled = sent[3]  # the caller gave up (a Stop): not the endpoint's error
                gone = cancelled is not None and cancelled()
                report(ModelAttempt.failed(at, begun, number, CANCELLED if gone else exc))
            raise
        if reply.usage.total == 0:
            written = len(reply.text) + sum(len(c.arguments) for c in reply.tool_calls)
            reply.usage = estimated_usage(messages, written)
        if report is not None:
            took = time.monotonic() - begun
            report(ModelAttempt(at, took, number, None, reply.usage, reply.finish_reason))
        return reply

    def _request(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        tool_choice: str | None,
        stop: list[str] | None,
    ) -> dict:
        """The request's body, minus what this endpoint was seen to refuse."""
        request: dict = {"model": self.name, "messages": [_wire(m) for m in messages]}
        if tools:
            request["tools"] = tools
            choice = tool_choice if tool_choice not in self._refused_choices else None
            choice = choice or ("auto" if "auto" not in self._refused_choices else None)
            if choice:
                request["tool_choice"] = choice
        if stop:
            request["stop"] = stop[:4]  # the API takes at most four
        if self.temperature is not None:
            request["temperature"] = self.temperature
        request[self._cap] = self.max_tokens
        return request

    # -- one request -----------------------------------------------------------------------

    def _send(
        self,
        request: dict,
        on_token: OnToken | None,
        deadline: float | None,
        cancelled: Callable[[], bool] | None,
    ) -> Reply:
        """One request (and its fallbacks), given up at the deadline, or once the caller
        cancels, whatever the server sends or withholds: its response is shut down from a
        timer (agent.model.deadline)."""
        started = time.monotonic()
        with RequestDeadline(deadline, cancelled) as limit:
            try:
                return self._send_once(request, on_token, limit)
            except LimitReached:
                raise  # the caller's own stop (a cancel, the wall seen in a token)
            except Exception:
                ended = limit.ended()
                if ended == "cancelled":
                    raise _Broken(f"the request to {self.where} was stopped from outside") from None
                if ended:  # whatever the shut-down socket or the cut read timeout raised
                    raise _Broken(self._busy_at_deadline(limit, started, request)) from None
                raise

    def _busy_at_deadline(self, limit: RequestDeadline, started: float, request: dict) -> str:
        if limit.chunks:
            got = f"the reply was still coming ({limit.chunks} chunks so far)"
        elif limit.answered:
            got = (
                "it had answered 200 but sent no token, only keep-alives or nothing: most "
                "likely queued behind an earlier request it is still generating"
            )
        else:
            got = "no response yet: most likely queued behind an earlier request"
        # a tool call llama-cpp-python cannot stream is asked unstreamed, and cannot be stopped
        hint = "use --protocol react (its replies stream), " if request.get("tools") else ""
        return (
            f"the model endpoint {self.where} was still busy with the request when the "
            f"question's wall time came ({time.monotonic() - started:.1f} s: {got}). Lower "
            f"--max-tokens [env SANDCELL_MAX_TOKENS] (now {self.max_tokens}), {hint}or start "
            "the server with its option to interrupt a request when a new one comes "
            "(llama-cpp-python: --interrupt_requests true, for streamed requests)."
        )

    def _send_once(self, request: dict, on_token: OnToken | None, limit: RequestDeadline) -> Reply:
        whole = False
        while True:  # each fallback below is taken at most once
            limit.begin()
            try:
                if whole:
                    return self._whole(request, on_token, limit)
                return self._stream(request, on_token, limit)
            except _Dropped:
                if limit.ended():  # the deadline shut it: no second request after the wall
                    raise
                # asked again unstreamed: the server's real error, or the reply (a tool call
                # llama-cpp-python's chatml-function-calling cannot stream); only this request,
                # so text replies go on streaming
                log.info(
                    "%s closed a streamed reply before any chunk: asking unstreamed", self.where
                )
                whole = True
            except openai.APIStatusError as exc:
                said, choice = str(exc), request.get("tool_choice")
                if exc.status_code == 400 and "max_tokens" in request and "max_completion" in said:
                    # OpenAI's o-series and gpt-5 models take only max_completion_tokens
                    log.info("%s takes max_completion_tokens, not max_tokens", self.where)
                    self._cap = "max_completion_tokens"
                    request["max_completion_tokens"] = request.pop("max_tokens")
                elif exc.status_code == 400 and self._usage_option and "stream_options" in said:
                    # strict servers refuse the field; usage is then estimated
                    log.info("%s refuses stream_options: %s", self.where, self._said(exc))
                    self._usage_option = False
                elif choice and choice not in self._refused_choices and refuses_choice(exc, choice):
                    log.info("%s refuses tool_choice %r: %s", self.where, choice, self._said(exc))
                    self._refused_choices.add(choice)
                    del request["tool_choice"]
                    if "auto" not in self._refused_choices:
                        request["tool_choice"] = "auto"
                else:
                    raise

    def _whole(self, request: dict, on_token: OnToken | None, limit: RequestDeadline) -> Reply:
        """One request unstreamed, for a server that can answer it only that way. Nothing
        arrives before the end, so the wait is bounded by the caller's deadline too, and a
        timeout, which may leave the server busy, is not retried. On a connection of its own:
        the dropped stream's may be back in the pool, and llama-cpp-python's server resets it."""
        wait, why = self._wait(limit.deadline)
        try:
            with self._new_client() as client:
                create = client.chat.completions.with_streaming_response.create
                with create(**request, timeout=wait) as response:  # the headers are in
                    limit.watch(response.http_response)
                    done = response.parse()
        except openai.APITimeoutError:
            raise _Broken(
                f"the model endpoint {self.where} sent no reply within {wait:.1f} s{why} to "
                "a request it can only answer unstreamed; not retried, since the server may still "
                "be busy with it. Lower --max-tokens [env SANDCELL_MAX_TOKENS] (now "
                f"{self.max_tokens}), or use --protocol react, whose replies stream."
            ) from None
        except (json.JSONDecodeError, openai.APIResponseValidationError) as exc:
            raise _BadBody(f"the reply is not a chat completion: {exc}") from exc
        if not getattr(done, "choices", None):
            raise _BadBody("the reply held no choice")
        got = Assembly(on_token)
        got.add_message(done.choices[0], done.usage)
        return got.reply()

    def _stream(self, request: dict, on_token: OnToken | None, limit: RequestDeadline) -> Reply:
        started = time.monotonic()
        got = Assembly(on_token)
        opened = False  # the endpoint answered 200 and the stream began
        # a server busy with an earlier request may keep the connection alive with SSE pings
        # and no token for minutes: no wait between chunks outlasts the caller's deadline
        wait = self._wait(limit.deadline)[0]
        try:
            extra = _INCLUDE_USAGE if self._usage_option else {}
            create = self.client.chat.completions.create
            with create(**request, stream=True, timeout=wait, **extra) as stream:
                opened = True
                limit.watch(stream.response)
                for chunk in stream:
                    got.add(chunk)
                    limit.chunks = got.chunks
                    if got.chunks > self.max_tokens:  # each chunk holds a token at least
                        # the server ignores max_tokens (llama-cpp-python's tool-calling
                        # format does): the reply is cut here, as the server should have
                        log.info("%s ignores max_tokens: reply cut", self.where)
                        got.finish = "length"
                        break
        except (json.JSONDecodeError, openai.APIResponseValidationError) as exc:
            if got.chunks:
                raise _Broken(self._cut_short(got, started, f"a chunk was garbled ({exc})"))
            raise _BadBody(f"a streamed chunk is not a chat-completion chunk: {exc}") from exc
        except openai.APIStatusError:
            raise  # refused before the stream began
        except openai.APIError as exc:  # timed out, connection lost, an error event
            if not got.seen_choice and closed(exc) and (opened or no_response(exc)):
                raise _Dropped() from None
            if not got.chunks:
                raise
            if isinstance(exc, openai.APITimeoutError):
                why = f"no data for {wait:g} s"
            elif isinstance(exc, openai.APIConnectionError):
                cause = exc.__cause__ or exc
                said = scrub(str(cause), self.base_url)
                why = f"the connection broke ({type(cause).__name__}: {said})"
            else:
                why = f"it sent an error: {self._said(exc)}"
            raise _Broken(self._cut_short(got, started, why)) from None
        if not got.seen_choice:
            raise _Dropped()  # a 200 and an empty stream: what went wrong is not said
        if got.finish is None:  # the connection closed cleanly, but before the reply ended
            if got.chunks:
                why = (
                    "the stream ended without a finish_reason (llama-cpp-python's server ends "
                    "a reply so when another request arrives, unless started with "
                    "--interrupt_requests false)"
                )
                raise _Broken(self._cut_short(got, started, why))
            raise _BadBody("the stream ended before any token or finish_reason")
        return got.reply()

    def _wait(self, deadline: float | None) -> tuple[float, str]:
        """The read timeout of one request: the client's, or less, to end by the deadline."""
        left = None if deadline is None else deadline - time.monotonic()
        if left is None or left >= self.timeout_s:
            return self.timeout_s, ""
        return max(0.5, left), ", the time the question had left"

    def _cut_short(self, got: Assembly, started: float, why: str) -> str:
        return (
            f"the model endpoint {self.where} stopped mid-reply after {got.chunks} chunks "
            f"({got.chars} characters, ending {got.tail()!r}) in "
            f"{time.monotonic() - started:.1f} s: {why}; not retried, since the server may "
            "still be busy with this reply. Check that the server is not stuck or overloaded, "
            f"or lower --max-tokens [env SANDCELL_MAX_TOKENS] (now {self.max_tokens})."
        )

    # -- errors ----------------------------------------------------------------------------

    def _said(self, exc: Exception) -> str:
        """What an error says, in short, without the URL's credentials (an HTTP client's
        message may quote the URL)."""
        return scrub(short(exc), self.base_url)

    def _explain(self, exc: Exception, tries: int) -> str:
        where = f"the model endpoint {self.where}"
        if isinstance(exc, openai.APITimeoutError):
            return (
                f"{where} sent nothing within {self.timeout_s:g} s; not retried, since the "
                "server may still be busy with the request. Check that it is not overloaded "
                "or stuck (a local server reading a long prompt on a slow CPU may need minutes)."
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            said = scrub(str(cause), self.base_url)
            return (
                f"cannot reach {where} ({type(cause).__name__}: {said}; {tries} tries). Check "
                "that the server is running and that OPENAI_BASE_URL (or --base-url) points at "
                "it, usually ending in /v1."
            )
        if isinstance(exc, openai.RateLimitError):
            return f"{where} kept answering 429 Too Many Requests ({tries} tries). Wait, or check the account's quota."
        if isinstance(exc, openai.APIStatusError):
            return f"{where} kept failing with HTTP {exc.status_code} ({tries} tries): {self._said(exc)}"
        return (
            f"{where} answered with something that is not an OpenAI chat completion ({tries} "
            f"tries): {self._said(exc)}. Check that OPENAI_BASE_URL is an OpenAI-compatible /v1 URL."
        )

    def _refused(self, exc: openai.APIStatusError, had_tools: bool, images: int = 0) -> ModelError:
        where, status = f"the model endpoint {self.where}", exc.status_code
        if _images_refused(exc, images):
            return ImagesUnsupported(
                f"{where} refused a request with {images} image(s) (HTTP {status}: "
                f"{self._said(exc)}): the model takes no image input. Use --vision off "
                f"[env SANDCELL_VISION], or a model that takes images."
            )
        if status in (401, 403):
            return ModelError(
                f"{where} rejected the API key (HTTP {status}: {self._said(exc)}). Check OPENAI_API_KEY "
                "(or --api-key) and that the key may use this model."
            )
        if status == 404:
            return ModelError(
                f"{where} answered 404 for model {self.name!r} ({self._said(exc)}). Check SANDCELL_MODEL "
                "(or --model) and that OPENAI_BASE_URL ends in /v1."
            )
        body = str(exc).lower()
        if had_tools and status in (400, 422) and any(w in body for w in _TOOL_WORDS):
            return ToolsUnsupported(f"{where} does not accept tool definitions: {self._said(exc)}")
        return ModelError(f"{where} refused the request (HTTP {status}): {self._said(exc)}")


def _wire(message: dict) -> dict:
    """A history message as every server takes it: an assistant's tool calls with content ""
    rather than null (llama-cpp-python's server refuses null there with an HTTP 500)."""
    if message.get("role") == "assistant" and message.get("content") is None:
        return {**message, "content": ""}
    return message


def _images_refused(exc: Exception, images: int) -> TypeGuard[openai.APIStatusError]:
    """A request with images refused for them (the code field counts: llama-cpp-python's)."""
    if not images or not isinstance(exc, openai.APIStatusError):
        return False
    return refuses_images(f"{exc} {exc.body}")
