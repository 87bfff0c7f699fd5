"""What other programs wrote, made safe to show on a terminal.

A cell's output, the model's words, an answer, a file name or an error a server sent may hold
terminal control sequences: OSC 52 writes the clipboard, OSC 0 the window title, OSC 8 makes
links, CSI moves the cursor and clears the screen; C1 controls (U+009B is a one-character CSI)
and bidirectional overrides rearrange what is seen. On a terminal every such character is
shown as a visible escape (ESC as `\\x1b`), keeping newlines and tabs; sandcell's own colours
are added around the text afterwards, so they still show. Piped output stays byte-exact.

Every place untrusted text reaches the terminal goes through `for_terminal` (or `echo`, for
click's plain lines; the rich console's printer in agent.cli.console calls it too)."""

from __future__ import annotations

import re
import sys
from typing import TextIO

import click

# C0 but newline and tab, DEL, C1, and the Unicode marks that reorder text as it is shown
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """Every control character but newline and tab as a visible escape. Per character, with no
    state, so a stream split anywhere is escaped the same as the whole."""
    return _CONTROL.sub(_shown, text)


def is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def for_terminal(text: str, terminal: bool) -> str:
    """The text as it may be written: escaped for a terminal, unchanged for a pipe or file."""
    return visible(text) if terminal else text


def echo(text: str, *, err: bool = False, nl: bool = True) -> None:
    """click.echo for text that came from elsewhere: escaped on a terminal; elsewhere written
    as it is (color=True: click would otherwise strip what looks like colour codes)."""
    stream = sys.stderr if err else sys.stdout
    click.echo(for_terminal(text, is_terminal(stream)), err=err, nl=nl, color=True)
