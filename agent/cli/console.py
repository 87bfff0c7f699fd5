"""Shows a run as it happens in the terminal: the model's words as they stream, the code it
runs (syntax-highlighted), observations, chart paths and the answer. One `on_event` handler
(a subscriber of agent.events) serves `chat`, `run` and the demo."""

import json
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax

from sandcell.agent.cli.table_layout import table_text
from sandcell.agent.cli.terminal import for_terminal
from sandcell.agent.events import (
    ActionStarted,
    Event,
    Final,
    NetConnection,
    Notice,
    Observation,
    Output,
    ProtocolChanged,
    Thought,
    Token,
    VisionOff,
)
from sandcell.sandbox.execution import Execution
from sandcell.sandbox.render import joined, parts


class EventPrinter:
    def __init__(
        self,
        console: Console | None = None,
        stream_tokens: bool = True,
        show_answer: bool = True,  # `run` prints the answer itself, on stdout
    ):
        self.console = console or Console(highlight=False)
        self.stream_tokens, self.show_answer = stream_tokens, show_answer
        self._streaming = False  # tokens printed since the last event
        self._streamed = ""  # the text of the reply streamed last
        self._printed = ""  # what the running cell printed, shown as it came
        self._shows: dict[type[Event], Callable] = {
            Thought: self._thought,
            ActionStarted: self._action,
            Output: self._output,
            Observation: self._observation,
            NetConnection: self._net,
            Notice: self._warning,
            ProtocolChanged: self._warning,
            VisionOff: self._warning,
            Final: self._answer,
        }

    def _safe(self, text: object) -> str:
        """Text from elsewhere (the model, a cell, a server) as rich markup: its control
        characters visible on a terminal (agent.cli.terminal), its brackets not markup."""
        return escape(for_terminal(str(text), self.console.is_terminal))

    def __call__(self, event: Event) -> None:
        if isinstance(event, Token):
            self._token(event)
            return
        show = self._shows.get(type(event))
        if show is None:
            return  # the trace's own records (a step, a session, ...)
        if self._streaming:
            self.console.print()
            self._streaming = False
        show(event)

    def _token(self, event: Token) -> None:
        if self.stream_tokens:
            if not self._streaming:
                self._streamed = ""
            self.console.print(self._safe(event.text), end="", style="dim")
            self._streaming, self._streamed = True, self._streamed + event.text

    def _thought(self, event: Thought) -> None:
        if event.text and not self.stream_tokens:
            self.console.print(f"[italic]{self._safe(event.text)}[/italic]")

    def _action(self, event: ActionStarted) -> None:
        tool, args = event.tool, event.args
        if isinstance(args, str):  # native tool calls carry their arguments as JSON text
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        code = args.get("code") if isinstance(args, dict) else None
        if tool == "python" and isinstance(code, str):
            self.console.print(
                Panel(
                    Syntax(
                        for_terminal(code, self.console.is_terminal), "python", theme="ansi_dark"
                    ),
                    title="python",
                    title_align="left",
                    border_style="blue",
                )
            )
        else:
            shown = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            self.console.print(f"[bold blue]{self._safe(tool)}[/bold blue] {self._safe(shown)}")

    def _output(self, event: Output) -> None:
        style = "red" if event.name == "stderr" else ""
        self.console.print(self._safe(event.text), end="", style=style)
        self._printed += event.text

    def _observation(self, event: Observation) -> None:
        printed, self._printed = self._printed, ""
        if printed and not printed.endswith("\n"):
            self.console.print()
        text = event.text  # what the model reads
        ex = event.execution
        tables = self._tables(ex) if ex is not None else []
        if ex is not None and (printed.strip() or any(tables)):
            # the same parts, for this terminal: output shown as the cell ran is not shown
            # again (no panel when nothing else is left), a table is laid out at its width
            p = parts(ex)
            results = [table or text for table, text in zip(tables, p.results, strict=True)]
            stream = "" if printed.strip() else p.stream
            text = joined([stream, *results, p.error or "", *p.notes])
            if not text.strip():
                return
        style = "green" if event.ok else "red"
        self.console.print(
            Panel(
                self._safe(text),
                title="observation",
                title_align="left",
                border_style=style,
            )
        )

    def _tables(self, execution: Execution) -> list[str | None]:
        """Each result's table (a DataFrame's HTML) laid out at the panel's width (its border
        and padding take 4 cells), or None for a result that is not a table."""
        width = max(20, self.console.width - 4)
        tables = []
        for result in execution.results:
            html = result.data.get("text/html")
            tables.append(table_text(html, width) if isinstance(html, str) else None)
        return tables

    def _net(self, event: NetConnection) -> None:
        """Where a cell went through the sandbox's proxy (--allow-net), or was refused."""
        style = "dim" if event.allowed else "red"
        self.console.print(f"[{style}]net: {self._safe(event.line())}[/{style}]")

    def _warning(self, event: Notice | ProtocolChanged | VisionOff) -> None:
        self.console.print(f"[yellow]note to the model: {self._safe(event.text)}[/yellow]")

    def _answer(self, event: Final) -> None:
        if not self.show_answer:
            return
        answer = event.answer
        if answer is not None and answer.strip() and answer.strip() in self._streamed:
            self._streamed = ""  # shown already as it streamed: once is enough
            return
        if answer is None:
            self.console.print(
                f"[red]stopped without an answer: {self._safe(event.stop_reason)} "
                f"{self._safe(event.detail or '')}[/red]"
            )
            return
        self.console.print(
            Panel(
                self._safe(answer),
                title="answer",
                title_align="left",
                border_style="bold green",
            )
        )
