"""When a failed request to the model endpoint is sent again, and after how long.

429, 5xx and connection errors are transient: sent again with exponential back-off and
jitter, or after the server's Retry-After (capped). A timeout is not retried (the server may
still be working on the request: a second one would only queue behind it), and a server that
refuses connections gets at most two more tries (a server that is down stays down)."""

from __future__ import annotations

import email.utils
import random
import time

import openai

TRANSIENT = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError)
MAX_WAIT_S = 60.0  # a Retry-After longer than this is not waited for in full


def retries_for(exc: Exception, max_retries: int) -> int:
    """How many times a request that failed with `exc` may be sent again."""
    if isinstance(exc, openai.APITimeoutError):
        return 0
    if isinstance(exc, openai.APIConnectionError):
        return min(max_retries, 2)
    return max_retries


def delay_s(exc: Exception, attempt: int, base_s: float) -> float:
    """The wait before try `attempt + 2`: the server's Retry-After (seconds or an HTTP date),
    else base_s * 2^attempt with up to half again of jitter."""
    response = getattr(exc, "response", None)
    after = response.headers.get("retry-after") if response is not None else None
    if after:
        try:
            return min(float(after), MAX_WAIT_S)
        except ValueError:
            when = email.utils.parsedate_to_datetime(after)
            return max(0.0, min(when.timestamp() - time.time(), MAX_WAIT_S))
    return base_s * (2**attempt) * (1 + random.random() / 2)
