"""Self-contained HTML pages (run reports): the shared style inline, data as JSON in a script element, no network.
The attention explorer has its own page (explorer.py)."""

from __future__ import annotations

import html
import json
import re
from typing import Any

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 12px; }
table.metrics td, table.metrics th { padding: 2px 10px; text-align: right; }
img { max-width: 100%; }
"""


def page(title: str, body: str, script: str = "") -> str:
    """A complete HTML document with the shared style inline; no external resources."""
    tail = f"<script>{script}</script>\n" if script else ""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n{tail}</body>\n</html>\n")


# Written as JSON's \uXXXX escapes inside an embedded script element: < and > (then no text can close the element or
# open a comment or a nested script in it: "</script>", "<!--", "<script"), & (an entity in XHTML), the line
# separators U+2028 / U+2029 (raw, they end a string in older JavaScript) and lone surrogates (they have no UTF-8).
_SCRIPT_UNSAFE = re.compile("[<>&\u2028\u2029\ud800-\udfff]")


def embed_json(element_id: str, obj: Any) -> str:
    """JSON inside a <script type="application/json"> element, for `JSON.parse(el.textContent)`: the characters that
    could change the page's structure are escaped, so any text in `obj` comes back exactly and stays data."""
    text = _SCRIPT_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}",
                              json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
    return f'<script type="application/json" id="{element_id}">{text}</script>'
