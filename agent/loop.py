"""The ReAct loop: ask the model, parse its reply, run the action, append the observation,
check the stop rules; repeat until a final answer or a rule ends the question.

Parsing lives in agent.protocols/parsing, stop rules in agent.stops, the context budget in
agent.context, words in agent.prompts. Control leaves a step by exceptions from agent.seams
(Submitted, LimitReached, Terminated, ModelError) or a SandboxError; every step is in the trace
before the next starts."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from sandcell.agent import context, prompts, stops
from sandcell.agent.events import (
    ActionStarted,
    Final,
    ModelRequest,
    NetConnection,
    Notice,
    Observation,
    OnEvent,
    ProtocolChanged,
    Question,
    Step,
    Thought,
    Token,
    VisionOff,
    observation_record,
)
from sandcell.agent.protocols import ActionProtocol, ReactProtocol, answer_from_text, make_protocol
from sandcell.agent.seams import (
    Action,
    FormatError,
    ImagesUnsupported,
    LimitReached,
    Model,
    ModelAttempt,
    ModelError,
    Reply,
    RunResult,
    Submitted,
    Terminated,
    ToolsUnsupported,
    Usage,
)
from sandcell.agent.stops import Rules, Watch
from sandcell.agent.vision import MODES as VISION_MODES
from sandcell.agent.vision import figures_message, without_images
from sandcell.sandbox import Execution, SandboxError
from sandcell.tools import Registry, ToolOutcome

__all__ = ["Loop", "OnEvent"]


class _Outcome(TypedDict):
    """How a question ended: the fields its Final event and its RunResult share."""

    answer: str | None
    stop_reason: str
    detail: str
    error: str | None
    steps: int


@dataclass
class Ran:
    """What one step's actions gave: the texts the model reads, the observations' records,
    the limit reached if one was, the Executions, the repeat warnings."""

    texts: list[str] = field(default_factory=list)
    observations: list[dict] = field(default_factory=list)
    stop: LimitReached | None = None
    executions: list[Execution] = field(default_factory=list)
    repeats: list[str] = field(default_factory=list)


class Loop:
    """One conversation: several questions share the history, the kernel and the trace."""

    def __init__(
        self,
        model: Model,
        registry: Registry,
        publish: OnEvent,  # each fact, once: the trace and any front end subscribe to it
        *,
        protocol: str = "auto",
        rules: Rules | None = None,
        inputs_profile: str = "",
        packages: str = "",  # what the prompt says of packages (prompts.packages_note)
        allow_net: tuple[str, ...] = (),  # the hosts the sandbox may reach (--allow-net)
        verify: Callable[[int], str | None] | None = None,
        vision: str = "auto",  # show the model the figures its code made (agent.vision)
    ):
        self.model, self.registry, self.publish = model, registry, publish
        # a final answer's declared output checks (agent.output_checks): None when they pass,
        # else what the model is told; the question number is its argument
        self.verify = verify
        self.rules = rules or Rules()
        self.auto = protocol == "auto"
        self.protocol: ActionProtocol = make_protocol(protocol)
        self.inputs_profile, self.packages, self.allow_net = inputs_profile, packages, allow_net
        if vision not in VISION_MODES:
            raise ValueError(f"unknown vision mode {vision!r}: use auto, on or off")
        self.vision = vision  # "off" from when an `auto` endpoint refused images
        self._notes: list[str] = []  # warnings of the running question said outside a step
        self.messages: list[dict] = [{"role": "system", "content": self._system()}]
        self.answers: list[str] = []
        self.questions = 0
        self.usage = Usage()
        self.cancelled: str | None = None  # a stop reason set from another thread

    def cancel(self, reason: str = stops.INTERRUPTED) -> None:
        """End the running question before its next model call (batch shutdown, a front end's
        stop button); the running cell itself is interrupted by the caller."""
        self.cancelled = reason

    def clear_cancel(self) -> None:
        """Forget a cancel that came as the question ended: it must not stop the next one."""
        self.cancelled = None

    def describe_inputs(self, profile: str) -> None:
        """New input files: the system prompt describes them from the next request on."""
        self.inputs_profile = profile
        self.messages[0] = {"role": "system", "content": self._system()}

    def reset(self) -> None:
        """An empty history: only the system prompt stays, and earlier answers are forgotten."""
        del self.messages[1:]
        self.answers.clear()

    def restore(self, messages: list[dict], questions: int) -> None:
        """Carry on a conversation recorded before (a served session after a server restart):
        its messages after the system prompt, and the number of questions asked."""
        self.messages[1:] = messages
        self.questions = questions

    def ask(self, question: str) -> RunResult:
        self.questions += 1
        started, watch = time.monotonic(), Watch(self.rules)
        self.messages.append({"role": "user", "content": question})
        self.publish(Question(question=self.questions, task=question))
        answer, reason, detail, error = None, stops.ANSWERED, "", None
        warnings: list[str] = []
        self._notes = []
        try:
            while True:
                warnings += self._step(watch, question)
        except Submitted as done:
            answer = done.answer
        except LimitReached as stop:
            reason, detail = stop.reason, stop.detail
            if stop.force_answer:
                answer, error = self._forced_answer(watch)
        except (ModelError, SandboxError) as exc:
            reason = stops.MODEL_ERROR if isinstance(exc, ModelError) else stops.SANDBOX_ERROR
            error = detail = str(exc)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM raised as it: keep what was done
            reason = stops.TERMINATED if isinstance(exc, Terminated) else stops.INTERRUPTED
            detail = str(exc) or "interrupted (Ctrl-C)"
            self._answer_open_calls()
        self.clear_cancel()
        warnings = self._notes + warnings
        if answer is not None:
            self.answers.append(answer)
        elapsed = time.monotonic() - started
        final: _Outcome = {
            "answer": answer,
            "stop_reason": reason,
            "detail": detail,
            "error": error,
            "steps": watch.steps,
        }
        self.publish(
            Final(question=self.questions, tokens=watch.tokens, duration_s=elapsed, **final)
        )
        # usage: the conversation's total so far (a one-question run: the question's)
        return RunResult(usage=self.usage, duration_s=elapsed, warnings=warnings, **final)

    def _step(self, watch: Watch, question: str) -> list[str]:
        if self.cancelled:
            raise LimitReached(self.cancelled, "the question was stopped from outside")
        watch.before_call()
        compacted = context.fit(self.messages, self.rules.context_chars, self.rules.keep_recent)
        choice = self._first_choice(watch)
        reply = self._complete(watch, timed=True, **choice)
        record = {
            "question": self.questions,
            "step": watch.steps,
            "reply": reply.to_dict(),
            "compacted": compacted,
            **choice,
        }
        if reply.finish_reason == "length" and not reply.tool_calls:  # never run half an action
            self._say(reply.text[-2000:], prompts.LENGTH_NUDGE, record, "cut by the length limit")
            watch.failed("a reply cut by the length limit")
            return []
        try:
            parsed, cut = self.protocol.parse(reply, self.registry)
        except FormatError as exc:
            if exc.text and prompts.nudged_for_label(self.messages):  # prose again after the nudge
                return self._answer(watch, question, exc.text, record)
            self._say(
                reply.text, str(exc) + (prompts.UNLABELLED if exc.text else ""), record, str(exc)
            )
            watch.failed(str(exc))
            return []
        self.messages.append(self.protocol.assistant_message(reply, cut))
        record.update(thought=parsed.thought, cut=cut)
        if parsed.answer is not None:
            return self._answer(watch, question, parsed.answer, record)
        self.publish(Thought(text=parsed.thought))
        warnings = [w for w in [watch.thought(parsed.thought)] if w]
        ran = self._execute(parsed.actions, watch)
        warnings += ran.repeats
        texts = ran.texts
        if warnings and not any(warnings[0] in t for t in texts):
            texts[-1] += "\n\n" + warnings[0]
        self.messages += self.protocol.observation_messages(parsed.actions, texts)
        figures = figures_message(ran.executions) if self.vision != "off" else None
        if figures:
            self._show(figures)
        self.publish(Step(**record, observations=ran.observations, warnings=warnings))
        if ran.stop is not None:
            raise ran.stop
        failed = [o for o in ran.observations if not o["ok"]]
        watch.failed(failed[-1]["text"][:200]) if failed else watch.succeeded()
        return warnings

    def _execute(self, actions: list[Action], watch: Watch) -> Ran:
        """Each action run (or, past a limit or a cancel, answered "not run": every call id
        gets its answer, so the history stays valid)."""
        ran = Ran()
        for action in actions:
            self.publish(ActionStarted(tool=action.tool, args=action.args, call_id=action.call_id))
            try:
                repeat = watch.action(action.key())
            except LimitReached as exc:
                ran.stop = ran.stop or exc
                outcome, repeat = ToolOutcome(False, f"not run: {exc.detail}"), None
            else:
                outcome = (
                    ToolOutcome(False, "not run")
                    if ran.stop or self.cancelled  # stopped from outside: start nothing more
                    else self.registry.call(action.tool, action.args)
                )
            ran.texts.append(outcome.text + (f"\n\n{repeat}" if repeat else ""))
            ran.observations.append(observation_record(action, outcome))
            ex = outcome.data if isinstance(outcome.data, Execution) else None
            ran.executions += [ex] if ex else []
            self.publish(
                Observation(tool=action.tool, ok=outcome.ok, text=outcome.text, execution=ex)
            )
            for connection in ex.net if ex else []:  # --allow-net: each in the trace
                self.publish(NetConnection(**connection))
            ran.repeats += [repeat] if repeat else []
        return ran

    def _attempted(self, attempt: ModelAttempt) -> None:
        """Each request sent to the model, retries too: in the trace, the metrics, the spans."""
        usage = attempt.usage
        self.publish(
            ModelRequest(
                model=self.model.name,
                sent=attempt.started,
                duration_s=round(attempt.duration_s, 4),
                attempt=attempt.number,
                error=attempt.error,
                input_tokens=usage.prompt_tokens if usage else None,
                output_tokens=usage.completion_tokens if usage else None,
                tokens_estimated=bool(usage and usage.estimated),
                finish_reason=attempt.finish_reason,
            )
        )

    def _answer_open_calls(self) -> None:
        """Tool calls cut short by an interrupt still get an answer: the history stays valid
        for the next question."""
        last = self.messages[-1]
        calls = last.get("tool_calls") if last.get("role") == "assistant" else None
        for call in calls or []:
            self.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": "not run: interrupted"}
            )

    def _answer(self, watch: Watch, question: str, answer: str, record: dict) -> list[str]:
        nudge = watch.check_answer(answer, question, self.answers)
        verify = self.verify if nudge is None else None  # checked only once the rules pass
        if verify is not None:
            nudge = verify(self.questions)
        self.publish(Step(**record, answer=answer, nudge=nudge))
        if nudge is None:
            raise Submitted(answer)
        if verify is not None:
            watch.checks_failed()  # past the retries the question stops here
        self.messages.append({"role": "user", "content": nudge})
        self.publish(Notice(text=nudge))
        return [nudge]

    def _first_choice(self, watch: Watch) -> dict:
        """With input files, the first request of a question must call a tool: the data is
        looked at before anything is claimed about it (an endpoint that refuses
        tool_choice "required" is asked without it, see agent.model.openai_model)."""
        if watch.steps == 1 and self.inputs_profile and self.protocol.name == "tools":
            return {"tool_choice": "required"}
        return {}

    def _complete(self, watch: Watch, timed: bool = False, **extra: str | None) -> Reply:
        request = self.protocol.request(self.registry)

        def on_token(text: str) -> None:
            self._token(text)
            if timed:  # a reply still streaming at the wall time is dropped, as on a cancel
                watch.check_wall()

        deadline = watch.started + self.rules.wall_s if timed else None
        try:
            reply = self.model.complete(
                self.messages,
                request["tools"],
                stop=request["stop"],
                on_token=on_token,
                deadline=deadline,
                cancelled=lambda: self.cancelled is not None,  # a Stop ends the request at once
                on_attempt=self._attempted,
                **extra,
            )
        except ImagesUnsupported as exc:
            if self.vision != "auto":
                raise
            self._vision_off(str(exc))
            return self._complete(watch, timed, **extra)  # once: no image is left to refuse
        except ToolsUnsupported as exc:
            if not self.auto or isinstance(self.protocol, ReactProtocol):
                raise
            self.protocol = ReactProtocol()  # `auto`: this endpoint takes no tool definitions
            self.messages[0] = {"role": "system", "content": self._system()}
            self.publish(ProtocolChanged(protocol="react", reason=str(exc)))
            extra.pop("tool_choice", None)
            return self._complete(watch, timed, **extra)
        except ModelError as exc:
            if self.cancelled:  # the request was given up for a cancel: that is what ended it
                raise LimitReached(
                    self.cancelled, "the question was stopped from outside"
                ) from None
            if timed:  # the request was given up at the wall time: that is what ended it
                watch.check_wall(str(exc))
            raise
        watch.spent(reply.usage.total)
        self.usage = self.usage + reply.usage
        return reply

    def _show(self, figures: dict) -> None:
        """The figures join a text observation (a user message: chat templates that want
        turns to alternate refuse two user messages in a row); after tool messages, which
        cannot hold images, they come in a user message of their own."""
        last = self.messages[-1]
        if last["role"] == "user" and isinstance(last["content"], str):
            last["content"] = [{"type": "text", "text": last["content"]}, *figures["content"]]
        else:
            self.messages.append(figures)

    def _vision_off(self, reason: str) -> None:
        """`auto`: the endpoint takes no images; none is sent from now on in this session."""
        self.vision = "off"
        n = without_images(self.messages, "not sent: the endpoint takes no images")
        event = VisionOff(reason=reason, images=n)
        self.publish(event)
        self._notes.append(event.text)

    def _token(self, text: str) -> None:
        """Each streamed token: shown to a UI, and where the question was cancelled the reply
        is dropped at once (a 4096-token reply from a slow server would otherwise hold it)."""
        if self.cancelled:
            raise LimitReached(self.cancelled, "the question was stopped from outside")
        self.publish(Token(text=text))

    def _forced_answer(self, watch: Watch) -> tuple[str | None, str | None]:
        """One last call without tools, asking for the best answer from what is known."""
        self.messages.append({"role": "user", "content": prompts.FORCED_ANSWER})
        choice = {"tool_choice": "none"} if self.protocol.name == "tools" else {}
        try:
            reply = self._complete(watch, timed=True, **choice)
        except (ModelError, LimitReached) as exc:  # the wall time, or a cancel, mid-reply
            return None, str(exc)
        answer = answer_from_text(reply.text, self.registry)
        self.messages.append({"role": "assistant", "content": reply.text})
        self.publish(
            Step(
                question=self.questions,
                step=watch.steps + 1,
                reply=reply.to_dict(),
                answer=answer,
                forced=True,
            )
        )
        return answer, None

    def _say(self, reply_text: str, feedback: str, record: dict, error: str) -> None:
        self.messages += [
            {"role": "assistant", "content": reply_text},
            {"role": "user", "content": feedback},
        ]
        self.publish(Step(**record, error=error, feedback=feedback))
        self.publish(Notice(text=feedback))

    def _system(self) -> str:
        instructions = self.protocol.instructions(self.registry)
        return prompts.system_prompt(
            self.inputs_profile, instructions, packages=self.packages, allow_net=self.allow_net
        )
