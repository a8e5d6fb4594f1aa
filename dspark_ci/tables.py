"""Plain-text tables for the terminal (`plan --format table`, `history`): columns padded, a dashed rule."""

from __future__ import annotations


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(value)) for value in column) for column in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(value).ljust(width) for value, width in zip(row, widths, strict=False)).rstrip()
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
