"""ModelSettings: what an OpenAI-compatible endpoint is called with, resolved in one place.

Each setting comes from what the caller gives (a CLI flag, an argument of `OpenAIModel`), else
its environment variable, else the default, and `ModelSettings.from_env` is the one reader of
those variables: the CLI resolves its flags through it once, `OpenAIModel(...)` does for the
Python API, and the value (frozen, picklable) is what `OpenAIModel.from_settings` and Ray's
nodes take. Light on purpose (no openai import): the CLI's options show its defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TypedDict, Unpack

from sandcell.agent.model.redact import HIDDEN, redact_url
from sandcell.agent.seams import ModelError

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_MAX_TOKENS = 4096  # a reply's cap, so a local model that never stops still ends

MODEL_ENV = "SANDCELL_MODEL"
BASE_URL_ENV = "OPENAI_BASE_URL"
API_KEY_ENV = "OPENAI_API_KEY"
MAX_TOKENS_ENV = "SANDCELL_MAX_TOKENS"


class _AsIs(TypedDict, total=False):
    """The settings `from_env` takes as given (no variable, no fallback of its own)."""

    temperature: float | None
    timeout_s: float
    max_retries: int
    retry_base_s: float


@dataclass(frozen=True)
class ModelSettings:
    name: str = DEFAULT_MODEL
    base_url: str = DEFAULT_BASE_URL
    api_key: str | None = field(default=None, repr=False)
    temperature: float | None = 0.0  # None: the endpoint's own default
    max_tokens: int = DEFAULT_MAX_TOKENS
    timeout_s: float = 120.0  # the read timeout: between chunks of a streamed reply
    max_retries: int = 4
    retry_base_s: float = 1.0

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int | None = None,
        **rest: Unpack[_AsIs],
    ) -> ModelSettings:
        """The settings from what is given, else env (os.environ unless given), else the
        defaults. None and "" count as not given, for the arguments and the variables alike
        (click's envvar did the same); `rest` (temperature, timeout_s, ...) is taken as is."""
        env = os.environ if env is None else env
        return cls(
            name=name or env.get(MODEL_ENV) or DEFAULT_MODEL,
            base_url=(base_url or env.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/"),
            api_key=api_key or env.get(API_KEY_ENV) or None,
            max_tokens=_max_tokens(max_tokens, env),
            **rest,
        )

    def filled(self, env: Mapping[str, str] | None = None) -> ModelSettings:
        """These settings with what is unset (a Ray node given no key) taken from env."""
        return ModelSettings.from_env(env, **asdict(self))

    @property
    def where(self) -> str:
        """The endpoint as messages show it: without the credentials its URL may carry."""
        return redact_url(self.base_url)

    def __repr__(self) -> str:  # neither the key nor the URL's credentials
        key = HIDDEN if self.api_key else None
        return (
            f"ModelSettings({self.name!r} at {self.where}, api_key={key}, "
            f"temperature={self.temperature}, max_tokens={self.max_tokens}, "
            f"timeout_s={self.timeout_s:g})"
        )


def endpoint_in(env: Mapping[str, str] | None = None) -> bool:
    """Whether env names an endpoint (a URL or a key): `make demo` replays its script if not."""
    env = os.environ if env is None else env
    return bool(env.get(BASE_URL_ENV) or env.get(API_KEY_ENV))


def _max_tokens(given: int | None, env: Mapping[str, str]) -> int:
    """The cap on each reply: the caller's (the CLI flag), else SANDCELL_MAX_TOKENS, else 4096."""
    raw = given if given is not None else env.get(MAX_TOKENS_ENV) or None
    if raw is None:
        return DEFAULT_MAX_TOKENS
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        where = "max_tokens" if given is not None else MAX_TOKENS_ENV
        raise ModelError(
            f"{where}={raw!r} is not a number of tokens: give a whole number of at least 1 "
            f"(the default is {DEFAULT_MAX_TOKENS})"
        )
    return cap
