"""Lines that fit the terminal: text broken at spaces only, so an id, a path or a URL longer than the room left stands
whole on a line of its own (copyable, never cut), and no line ends in spaces. Presentation only.

Every rendering of the command line (list, show, the dry run, jobs, errors, --version) is a list of rich Text lines
made here at the console's width, printed as they are (rich wraps nothing more).
"""

from __future__ import annotations

import re
import shlex

from rich.console import Console
from rich.text import Text

WORD = re.compile(r"\S+")
SHELL_CONTINUATION = " \\"


def wrap(text: Text | str, width: int, indent: int = 0, first_indent: int | None = None) -> list[Text]:
    """text broken at spaces into lines of at most `width` columns: the first line indented by `first_indent` (by
    default `indent`: a hanging indent when they differ), the others by `indent`."""
    text = text if isinstance(text, Text) else Text(text)
    first_indent = indent if first_indent is None else first_indent
    lines: list[Text] = []
    for paragraph in text.split("\n", allow_blank=True):
        lead = indent if lines else first_indent
        breaks = _breaks(paragraph.plain, max(width - lead, 1), max(width - indent, 1))
        for piece in paragraph.divide(breaks) if paragraph.plain else [paragraph]:
            line = Text.assemble(" " * (indent if lines else first_indent), piece)
            line.rstrip()
            lines.append(line)
    return lines


def _breaks(plain: str, first_room: int, room: int) -> list[int]:
    """Where a line ends: before each word that would not fit on the line it starts on (never inside a word)."""
    offsets, start_of_line, line_room = [], 0, first_room
    for word in WORD.finditer(plain):
        if word.end() - start_of_line > line_room and word.start() > start_of_line:
            offsets.append(word.start())
            start_of_line, line_room = word.start(), room
    return offsets


def key_values(rows: list[tuple[str, Text | str]], width: int, indent: int = 0) -> list[Text]:
    """key  value rows, the values aligned and wrapped under themselves."""
    column = indent + max((len(key) for key, _ in rows), default=0) + 2
    lines: list[Text] = []
    for key, value in rows:
        lines += wrap(Text.assemble((key, "bold"), " " * (column - indent - len(key)), value), width, column, indent)
    return lines


def shell_lines(argv: list[str], width: int, indent: int = 0) -> list[Text]:
    """A command as shell words, lines continued with a backslash where it would not fit: pasted, it runs as it is."""
    words, lines, current = [shlex.quote(word) for word in argv], [], ""
    for word in words:
        room = width - indent - len(SHELL_CONTINUATION) - (4 if lines else 0)
        if current and len(current) + 1 + len(word) > room:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    lines.append(current)
    return [
        Text(" " * indent + ("    " if i else "") + line + (SHELL_CONTINUATION if i < len(lines) - 1 else ""))
        for i, line in enumerate(lines)
    ]


def yaml_lines(text: str, width: int, indent: int = 0) -> list[Text]:
    """YAML as it reads, a line too long for the width folded as YAML allows: its value on the lines below its key,
    more indented, broken at spaces only. yaml.safe_load reads the same data back."""
    lines: list[Text] = []
    for line in text.rstrip("\n").splitlines():
        own = len(line) - len(line.lstrip(" "))
        key, sep, value = line.strip().partition(": ")
        if not sep and line.strip().startswith("- "):
            key, sep, value = "-", " ", line.strip()[2:]
        if indent + len(line) <= width or not sep or not value:
            lines.append(Text(" " * indent + line))
            continue
        lines.append(Text(" " * (indent + own) + key + sep.rstrip()))
        lines += wrap(value, width, indent + own + 2)
    return lines


def heading(title: Text | str, width: int) -> list[Text]:
    lines = wrap(title, width, 2, 0)
    for line in lines:
        line.stylize("bold")
    return lines


def print_lines(console: Console, lines: list[Text]) -> None:
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False)
