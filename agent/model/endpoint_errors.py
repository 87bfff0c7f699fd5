"""How an OpenAI-compatible endpoint's errors are told apart (agent.model.openai_model acts on them): a
connection that closed, a request the server calls invalid, a tool_choice it refuses, and the
short form of any error for a message."""

from __future__ import annotations

from typing import TypeGuard

import openai


def closed(exc: Exception) -> bool:
    """The connection closed or broke (not a timeout, not an error event the server sent)."""
    return isinstance(exc, openai.APIConnectionError) and not isinstance(
        exc, openai.APITimeoutError
    )


def invalid(exc: Exception) -> TypeGuard[openai.InternalServerError]:
    """An HTTP 500 that says the request itself is invalid (llama-cpp-python's server answers
    a body it cannot validate so): not a passing failure, so not retried."""
    return isinstance(exc, openai.InternalServerError) and "validation error" in str(exc)


def no_response(exc: Exception) -> bool:
    """The server read the request and closed the connection without a response (httpx's
    RemoteProtocolError; llama-cpp-python's server does that too when a streamed request fails
    at once). Unlike a refused connection, the server is there, and done with the request."""
    return type(exc.__cause__).__name__ == "RemoteProtocolError"


def refuses_choice(exc: openai.APIStatusError, choice: str) -> bool:
    """A refusal of the request's tool_choice: a 400/422 naming it, or the bare HTTP 500 that
    llama-cpp-python's chatml-function-calling answers "required" with (a failed assertion,
    so an empty message). Any other 500 is an ordinary server error, retried as such."""
    if exc.status_code in (400, 422):
        return "tool_choice" in str(exc)
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error", body)
    said = error.get("message") if isinstance(error, dict) else body
    return exc.status_code == 500 and choice != "auto" and not said


def short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."
