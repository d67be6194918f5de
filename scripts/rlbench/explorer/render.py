"""The run explorer's page: one standalone HTML file (inline style, script and data; no external URL),
so it opens from the disk or from an archive of the results.

The page's data (the package docstring's schema) is embedded as JSON in
`<script type="application/json" id="run-data">`, with `<`, `>`, `&`, U+2028 and U+2029 escaped so no
text of the agent's can end the script element; the script (assets/run_page.js) reads it and builds
the page with text nodes only, never markup from the data. The same data gives the same bytes.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from rlbench.fileio.jsonio import write_text

ASSETS = Path(__file__).parent / "assets"
#: what the page's script reads the data from
DATA_ELEMENT_ID = "run-data"
_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _finite(value):
    """The value with every NaN or infinity replaced by None (JSON has neither; the page shows "–")."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def embedded_json(data: dict) -> str:
    """The data as JSON that is safe inside a script element. Keys stay in the data's order (the page
    shows the summary's iteration fields in it; page_data builds every object in a fixed order, so the
    same records give the same text); a value JSON cannot hold (NaN, a date) becomes null or its text."""
    options = {"ensure_ascii": False, "separators": (",", ":"), "allow_nan": False, "default": str}
    try:
        text = json.dumps(data, **options)
    except ValueError:  # NaN or infinity somewhere in the records
        text = json.dumps(_finite(data), **options)
    return text.translate(_ESCAPES)


def render_page(data: dict) -> str:
    """The page for one run's data (rlbench.explorer.data.page_data)."""
    template = (ASSETS / "run_page.html").read_text()
    parts = {
        "{{title}}": html.escape(f"run: {data.get('title') or '?'}"),
        "{{css}}": (ASSETS / "run_page.css").read_text(),
        "{{data}}": embedded_json(data),
        "{{js}}": (ASSETS / "run_page.js").read_text(),
    }
    out = template
    for key in ("{{title}}", "{{css}}", "{{js}}"):  # the data last: nothing in it is read as a placeholder
        out = out.replace(key, parts[key])
    return out.replace("{{data}}", parts["{{data}}"])


def write_page(path: Path, data: dict) -> Path:
    """Write the page atomically (a reader never sees half a page); returns its path."""
    path = Path(path)
    write_text(path, render_page(data), durable=False)
    return path
