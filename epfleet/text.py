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
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping

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


def table(headers: list[str], rows: list[list[str]]) -> str:
    headers = [printable(h) for h in headers]
    rows = [[printable(c) for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


MB = 1_000_000


def mb(size: int) -> str:
    """``size`` in MB for messages (two decimals below 1 MB)."""
    return f"{size / MB:.2f}" if 0 < size < MB else f"{size / MB:.1f}"
