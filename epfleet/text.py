"""Plain-text rendering shared by every command: byte sizes, counted nouns, aligned
tables, and text from outside (a device report's names and reasons) made safe to show.

Anyone who can write a device report chooses its strings. ``printable`` is what a
terminal may be shown of one: control characters (escape sequences, line breaks, a
carriage return that redraws a line), Unicode format characters (bidi overrides) and
line separators become ``\\x1b``-style escapes; ``table`` applies it to every cell, and
``printable_lines`` to every line of a message (the command line's errors).
``markdown_text`` is what a Markdown artifact may be shown: ``printable``, with the
characters Markdown or HTML would interpret (``|`` ending a table cell, links, emphasis,
code, tags) escaped. The Prefect UI renders a table artifact's cells as Markdown too
(prefect-ui-library #2190): ``markdown_cells`` escapes a row of one.

What a person reads is fitted to their terminal (``output_width``: ``$COLUMNS``, else
the terminal's width; a pipe gets whole lines): ``wrap`` breaks lines at spaces,
``table`` wraps, leaves out or stacks columns, and neither cuts a word's meaning off.
"""

from __future__ import annotations

import math
import os
import re
import sys
import textwrap
import unicodedata
from collections.abc import Mapping
from typing import TextIO

_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MARKDOWN = re.compile(r"([\\`*_\[\]#|~>])")


def format_bytes(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def share(fraction: float) -> str:
    """A fraction as a percentage rounded down, so that only 1.0 reads ``100%``:
    ``0.9987`` is ``99.8%``, ``0.85`` is ``85%``."""
    return f"{math.floor(round(fraction * 1000, 6)) / 10:g}%"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 golden sample``, ``2 golden samples``."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on escaped (see the module)."""
    if text.isprintable():
        return text
    return "".join(
        _escape(c) if _UNSAFE.match(c) or unicodedata.category(c) == "Cf" else c for c in text
    )


def printable_lines(text: str) -> str:
    """``text`` with each line ``printable`` and its line breaks kept: a message of several
    lines (a spec's errors, one per field) whose lines may quote text from outside."""
    return "\n".join(printable(line) for line in text.split("\n"))


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def markdown_text(text: str) -> str:
    """``text`` safe inside a Markdown artifact (a table cell, a list item)."""
    escaped = _MARKDOWN.sub(r"\\\1", printable(text))
    return escaped.replace("&", "&amp;").replace("<", "&lt;")


def markdown_cells(row: Mapping[str, object]) -> dict[str, str]:
    """A table artifact's row, every cell ``markdown_text``."""
    return {key: markdown_text(str(cell)) for key, cell in row.items()}


def output_width(stream: TextIO | None = None) -> int | None:
    """The width to fit text to: ``$COLUMNS`` when set, else the width of the terminal
    ``stream`` (stdout by default) is; None when it is a pipe or a file (whole lines, for
    ``grep`` and friends)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # a stream without a file (tests swap it)
        pass
    return None


def show(text: str) -> None:
    """Print ``text`` on stdout for a person: each line wrapped to ``output_width``."""
    print(wrap(text, output_width()))


def wrap(text: str, width: int | None, indent: str = "  ") -> str:
    """``text`` with each of its lines broken at spaces to at most ``width`` characters,
    the lines it continues on indented by ``indent``; a word longer than a line (a path, a
    URL) is split across lines rather than cut. ``width`` None: unchanged."""
    if width is None:
        return text
    out: list[str] = []
    for line in text.split("\n"):
        lead = line[: len(line) - len(line.lstrip(" "))]
        out += textwrap.wrap(
            line,
            width,
            subsequent_indent=lead + indent,
            break_long_words=True,
            break_on_hyphens=False,
            drop_whitespace=True,
        ) or [""]
    return "\n".join(out)


GAP = "  "
NARROWEST_WRAPPED = 12
"""A column of wrapped text is not made narrower than this (nor than its header)."""


def table(
    headers: list[str],
    rows: list[list[str]],
    width: int | None = None,
    *,
    wrapped: tuple[str, ...] = (),
    droppable: tuple[str, ...] = (),
) -> str:
    """Rows under their headers, aligned, every cell ``printable``.

    With a ``width``, the table is fitted to it without cutting a cell: the ``wrapped``
    columns are wrapped onto more lines (the widest first, none narrower than
    ``NARROWEST_WRAPPED``); when that is not enough, the ``droppable`` columns are left
    out in their order and a last line names them; when even that is not enough, each
    row is printed as a block of ``header: value`` lines."""
    headers = [printable(h) for h in headers]
    rows = [[printable(c) for c in r] for r in rows]
    columns = list(range(len(headers)))
    if width is None:
        return _rows_text(headers, rows, columns, _natural(headers, rows, columns))
    wrappable = {headers.index(h) for h in wrapped if h in headers}
    dropped: list[str] = []
    for name in (None, *droppable):
        if name is not None and name in headers:
            columns.remove(headers.index(name))
            dropped.append(name)
        widths = _fitted_widths(headers, rows, columns, wrappable, width)
        if widths is not None:
            text = _rows_text(headers, rows, columns, widths)
            if dropped:
                note = f"not shown at {width} columns: {', '.join(dropped)} (a wider terminal, "
                text += "\n" + wrap(note + "or --json, shows them)", width)
            return text
    return _records(headers, rows, width)


def _natural(headers: list[str], rows: list[list[str]], columns: list[int]) -> dict[int, int]:
    return {i: max([len(headers[i])] + [len(r[i]) for r in rows]) for i in columns}


def _fitted_widths(
    headers: list[str], rows: list[list[str]], columns: list[int], wrappable: set[int], width: int
) -> dict[int, int] | None:
    widths = _natural(headers, rows, columns)
    excess = sum(widths.values()) + len(GAP) * (len(columns) - 1) - width
    floors = {i: min(widths[i], max(NARROWEST_WRAPPED, len(headers[i]))) for i in columns}
    while excess > 0:
        room = [i for i in columns if i in wrappable and widths[i] > floors[i]]
        if not room:
            return None
        widest = max(room, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return widths


def _rows_text(
    headers: list[str], rows: list[list[str]], columns: list[int], widths: dict[int, int]
) -> str:
    def lines_of(cells: list[str]) -> list[str]:
        parts = {i: _cell_lines(cells[i], widths[i]) for i in columns}
        height = max(len(p) for p in parts.values())
        return [
            GAP.join(
                (parts[i][n] if n < len(parts[i]) else "").ljust(widths[i]) for i in columns
            ).rstrip()
            for n in range(height)
        ]

    out = lines_of(headers)
    out.append(GAP.join("-" * widths[i] for i in columns))
    for row in rows:
        out += lines_of(row)
    return "\n".join(out)


def _cell_lines(cell: str, width: int) -> list[str]:
    if len(cell) <= width:
        return [cell]
    return textwrap.wrap(cell, width, break_long_words=True, break_on_hyphens=False) or [""]


def _records(headers: list[str], rows: list[list[str]], width: int) -> str:
    """Each row as ``header: value`` lines, the first flush and the others indented, every
    line wrapped to ``width``: a table too wide for the terminal even wrapped."""
    blocks = []
    for row in rows:
        lines = [
            wrap(f"{'' if n == 0 else GAP}{header}: {cell}", width, indent=GAP * 2)
            for n, (header, cell) in enumerate(zip(headers, row, strict=True))
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


MB = 1_000_000


def mb(size: int) -> str:
    """``size`` in MB for messages (two decimals below 1 MB)."""
    return f"{size / MB:.2f}" if 0 < size < MB else f"{size / MB:.1f}"
