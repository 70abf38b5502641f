"""A report's Markdown lines as one self-contained HTML page (images inlined), for reading without a renderer.

Knows only what the reports write: `#`/`##` headings, `- ` items, `|` tables and `![name](file.png)` images
beside the report; any other non-empty line is a paragraph."""

from __future__ import annotations

import base64
import html
from pathlib import Path

STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}td{border:1px solid #ccc;padding:3px 6px;"
         "font-size:13px}table{border-collapse:collapse}img{max-width:100%}")


def html_page(lines: list[str], folder: Path, title: str) -> str:
    """The page for `lines` (a report.md's), its images read from `folder`."""
    body = [item for item in (_element(line, folder) for line in lines) if item]
    return f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>{STYLE}</style>" \
        + _wrap_tables(body)


def _element(line: str, folder: Path) -> str:
    if line.startswith("!["):
        name = line[line.index("(") + 1:-1]
        data = base64.b64encode((folder / name).read_bytes()).decode()
        return f'<p><img alt="{html.escape(name)}" src="data:image/png;base64,{data}"></p>'
    for prefix, tag in (("# ", "h1"), ("## ", "h2"), ("- ", "li")):
        if line.startswith(prefix):
            return f"<{tag}>{html.escape(line[len(prefix):])}</{tag}>"
    if line.startswith("|"):
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set("".join(cells)) <= {"-"}:
            return ""
        return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
    return f"<p>{html.escape(line)}</p>" if line else ""


def _wrap_tables(body: list[str]) -> str:
    """Consecutive rows inside one <table>."""
    out, inside = [], False
    for item in body:
        if item.startswith("<tr>") != inside:
            out.append("<table>" if not inside else "</table>")
            inside = not inside
        out.append(item)
    if inside:
        out.append("</table>")
    return "\n".join(out)
