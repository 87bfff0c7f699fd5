"""Stop conditions: what ends a run (or warns the model first), kept apart from the loop.

`Rules` holds the numbers (all configurable); `Watch` holds one question's counters and raises
LimitReached when a rule fires, or returns a warning for the loop to append to the history.
The step limit is never told to the model."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from sandcell.agent.seams import LimitReached

# Stop reasons, as RunResult.stop_reason reports them.
ANSWERED = "answered"
MAX_STEPS = "max_steps"
FAILURES = "consecutive_failures"
REPEATED = "repeated_action"
WALL_TIME = "wall_time"
TOKENS = "token_budget"
MODEL_ERROR = "model_error"
SANDBOX_ERROR = "sandbox_error"
INTERRUPTED = "interrupted"  # Ctrl-C, or a front end cancelled the question
TERMINATED = "terminated"  # SIGTERM
CHECKS_FAILED = "checks_failed"  # the outputs failed their declared checks too many times


@dataclass(frozen=True)
class Rules:
    max_steps: int = 20  # model calls per question, then one forced answer without tools
    max_failures: int = 5  # consecutive failed actions or unusable replies
    max_repeats: int = 1  # identical (tool, args) repeats: the first warns, the next stops
    wall_s: float = 900.0  # per question
    token_budget: int = 400_000  # prompt + completion tokens per question (not one reply's cap)
    quality_retries: int = 1  # empty, evasive or repeated answers get this many nudges
    context_chars: int = 60_000  # history size before older observations are compacted
    keep_recent: int = 3  # newest steps always kept whole
    check_retries: int = 3  # final answers whose outputs fail their checks, then the stop


_EVASIVE = re.compile(
    r"^\W*(i (cannot|can't|am unable|'m unable|do not know|don't know|could not|couldn't)|"
    r"as an ai|unable to (determine|answer)|sorry|i apologi[sz]e|n/?a\b|unknown\b|"
    r"无法|抱歉|我不知道|对不起)",
    re.IGNORECASE,
)


@dataclass
class Watch:
    rules: Rules
    started: float = field(default_factory=time.monotonic)
    steps: int = 0
    tokens: int = 0
    failures: int = 0
    actions: dict[str, int] = field(default_factory=dict)  # action key -> times seen
    thoughts: set[str] = field(default_factory=set)
    warned_thoughts: set[str] = field(default_factory=set)
    quality_nudges: int = 0
    check_failures: int = 0

    def before_call(self) -> None:
        """Called before every model call: the budgets that need no reply to check."""
        self.check_wall()
        if self.tokens > self.rules.token_budget:
            raise LimitReached(
                TOKENS, f"{self.tokens} tokens used, budget {self.rules.token_budget}"
            )
        if self.steps >= self.rules.max_steps:
            raise LimitReached(MAX_STEPS, f"{self.steps} steps", force_answer=True)
        self.steps += 1

    def check_wall(self, why: str = "") -> None:
        """Also called as a reply streams in: a slow model writing a long reply still ends
        the question within its wall time. `why`: what was under way when it came."""
        if time.monotonic() - self.started >= self.rules.wall_s:
            detail = f"the question took more than {self.rules.wall_s:g} s"
            raise LimitReached(WALL_TIME, f"{detail}: {why}" if why else detail)

    def spent(self, tokens: int) -> None:
        self.tokens += tokens

    def failed(self, what: str) -> None:
        self.failures += 1
        if self.failures >= self.rules.max_failures:
            raise LimitReached(FAILURES, f"{self.failures} failures in a row, the last: {what}")

    def succeeded(self) -> None:
        self.failures = 0

    def checks_failed(self) -> None:
        """A final answer whose outputs failed their checks; past the retries the stop."""
        self.check_failures += 1
        if self.check_failures >= self.rules.check_retries:
            raise LimitReached(
                CHECKS_FAILED,
                f"the outputs failed their checks on {self.check_failures} final answer(s)",
            )

    def action(self, key: str) -> str | None:
        """Count an action. A repeat returns a warning; more repeats than allowed stop the run."""
        seen = self.actions.get(key, 0)
        self.actions[key] = seen + 1
        if seen == 0:
            return None
        if seen > self.rules.max_repeats:
            raise LimitReached(REPEATED, f"the same action was sent {seen + 1} times: {key[:200]}")
        return (
            "Note: you already ran exactly this action with the same arguments; the result "
            "will not change. Do something different, or give the Final Answer."
        )

    def thought(self, text: str) -> str | None:
        key = _norm(text)
        if len(key) < 20:
            return None
        if key in self.thoughts and key not in self.warned_thoughts:
            self.warned_thoughts.add(key)
            return (
                "Note: this thought repeats an earlier one word for word. You may be going in "
                "circles: use what the observations showed, try another approach, or answer."
            )
        self.thoughts.add(key)
        return None

    def check_answer(self, answer: str, question: str, earlier: list[str]) -> str | None:
        """The answer-quality gate: a nudge for an empty, evasive or repeated answer (at most
        `quality_retries` times per question), else None to accept it."""
        if self.quality_nudges >= self.rules.quality_retries:
            return None
        text = answer.strip()
        problem = None
        if not text:
            problem = "Your final answer was empty."
        elif len(text) < 300 and _EVASIVE.search(text):
            problem = "Your final answer does not answer the question."
        elif _same(text, question) or any(_same(text, e) for e in earlier):
            problem = (
                "Your final answer repeats an earlier text instead of answering this question."
            )
        if problem is None:
            return None
        self.quality_nudges += 1
        return (
            f"{problem} Use the tools to find what is missing if you need to, then give a "
            "complete, specific Final Answer to the question. If it truly cannot be answered "
            "from the data, say exactly what is missing."
        )


def _norm(text: str) -> str:
    """Case and spacing do not make a thought or an answer new."""
    return " ".join(text.lower().split())


def _same(a: str, b: str) -> bool:
    return _norm(a) == _norm(b)
