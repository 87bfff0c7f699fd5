"""Shows a run as it happens in the terminal: the model's words as they stream, the code it
runs (syntax-highlighted), observations, chart paths and the answer. One `on_event` handler
serves `chat` and the demo."""

import json

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax

from agent.cli.terminal import for_terminal


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

    def _safe(self, text: object) -> str:
        """Text from elsewhere (the model, a cell, a server) as rich markup: its control
        characters visible on a terminal (agent.cli.terminal), its brackets not markup."""
        return escape(for_terminal(str(text), self.console.is_terminal))

    def __call__(self, kind: str, data: dict) -> None:
        if kind == "token":
            if self.stream_tokens:
                if not self._streaming:
                    self._streamed = ""
                text = str(data.get("text", ""))
                self.console.print(self._safe(text), end="", style="dim")
                self._streaming, self._streamed = True, self._streamed + text
            return
        if self._streaming:
            self.console.print()
            self._streaming = False
        show = getattr(self, f"_{kind}", None)
        if show is not None:
            show(data)

    def _thought(self, data: dict) -> None:
        if data.get("text") and not self.stream_tokens:
            self.console.print(f"[italic]{self._safe(data['text'])}[/italic]")

    def _action(self, data: dict) -> None:
        tool, args = data.get("tool"), data.get("args")
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

    def _output(self, data: dict) -> None:
        text = str(data.get("text", ""))
        self.console.print(
            self._safe(text), end="", style="red" if data.get("name") == "stderr" else ""
        )
        self._printed += text

    def _observation(self, data: dict) -> None:
        printed, self._printed = self._printed, ""
        if printed and not printed.endswith("\n"):
            self.console.print()
        if printed.strip() and str(data.get("text", "")).strip() == printed.strip():
            return  # the model sees just what was shown as the cell ran: once is enough
        style = "green" if data.get("ok") else "red"
        self.console.print(
            Panel(
                self._safe(data.get("text", "")),
                title="observation",
                title_align="left",
                border_style=style,
            )
        )

    def _warning(self, data: dict) -> None:
        self.console.print(
            f"[yellow]note to the model: {self._safe(data.get('text', ''))}[/yellow]"
        )

    def _answer(self, data: dict) -> None:
        if not self.show_answer:
            return
        answer = data.get("answer")
        if answer is not None and answer.strip() and answer.strip() in self._streamed:
            self._streamed = ""  # shown already as it streamed: once is enough
            return
        if data.get("answer") is None:
            reason = data.get("stop_reason")
            self.console.print(
                f"[red]stopped without an answer: {self._safe(reason)} "
                f"{self._safe(data.get('detail') or '')}[/red]"
            )
            return
        self.console.print(
            Panel(
                self._safe(data["answer"]),
                title="answer",
                title_align="left",
                border_style="bold green",
            )
        )
