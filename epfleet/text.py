"""Plain-text rendering shared by every command: byte sizes, counted nouns and aligned
tables."""

from __future__ import annotations


def format_bytes(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 golden sample``, ``2 golden samples``."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def table(headers: list[str], rows: list[list[str]]) -> str:
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
