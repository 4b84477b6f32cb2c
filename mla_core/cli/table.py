"""Plain-text tables for the CLI."""
from __future__ import annotations


def table(rows: list[list[str]], header: list[str]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]

    def line(r):
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
