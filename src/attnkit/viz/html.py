"""A self-contained interactive attention page: no network, the maps embedded as JSON.

Pick a sentence, an attention kind, a layer and a head (or their mean); hover a query token (a row)
or a key token (a column) to read its weights. Everything is in one file: open it anywhere, offline.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from attnkit.io import atomic_write_text
from attnkit.viz.attention import AttentionView

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
.controls label { margin-right: 1em; } .controls select { margin-left: 0.3em; }
table.attn { border-collapse: collapse; margin-top: 1em; font-size: 12px; }
table.attn td { width: 22px; height: 22px; border: 1px solid #eee; text-align: center; font-size: 9px; }
table.attn th { font-weight: normal; padding: 2px 4px; white-space: nowrap; cursor: default; }
table.attn th.key { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }
table.attn .on { outline: 2px solid #e4572e; }
table.attn td.memory { border-right: 2px dashed #e4572e; }
#info { margin-top: 1em; min-height: 3em; font-size: 14px; line-height: 2; }
#info span { padding: 2px 4px; margin: 1px; border-radius: 3px; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 12px; }
table.metrics td, table.metrics th { padding: 2px 10px; text-align: right; }
img { max-width: 100%; }
"""

SCRIPT = """
const DATA = JSON.parse(document.getElementById('attn-data').textContent);
const $ = (id) => document.getElementById(id);
function fill(sel, items) {
  sel.innerHTML = '';
  for (const [value, text] of items) {
    const o = document.createElement('option'); o.value = value; o.textContent = text; sel.appendChild(o);
  }
}
function sentence() { return DATA.sentences[+$('sentence').value]; }
function kind() { return sentence().kinds[$('kind').value]; }
function matrix() {
  const heads = kind().layers[+$('layer').value], h = $('head').value;
  if (h !== 'mean') return heads[+h];
  return heads[0].map((row, i) => row.map((_, j) => heads.reduce((s, m) => s + m[i][j], 0) / heads.length));
}
function shade(w) { return 'rgba(48, 18, 140,' + Math.min(1, Math.max(0, w)).toFixed(3) + ')'; }
function onSentence() {
  const s = sentence();
  $('source').textContent = s.source; $('output').textContent = s.output;
  fill($('kind'), Object.keys(s.kinds).map((k) => [k, s.kinds[k].title]));
  onKind();
}
function onKind() {
  const k = kind();
  fill($('layer'), k.layers.map((_, i) => [i, 'layer ' + (i + 1)]));
  fill($('head'), [['mean', 'mean of heads']].concat(k.layers[0].map((_, h) => [h, 'head ' + (h + 1)])));
  draw();
}
function draw() {
  const k = kind(), m = matrix(), table = $('grid');
  table.innerHTML = '';
  const head = table.insertRow(); head.appendChild(document.createElement('th'));
  k.keys.forEach((tok, j) => {
    const th = document.createElement('th'); th.className = 'key'; th.textContent = tok;
    th.onmouseenter = () => show(null, j); head.appendChild(th);
  });
  m.forEach((row, i) => {
    const tr = table.insertRow(), th = document.createElement('th');
    th.textContent = k.queries[i]; th.onmouseenter = () => show(i, null); tr.appendChild(th);
    row.forEach((w, j) => {
      const td = tr.insertCell(); td.style.background = shade(w);
      td.title = k.queries[i] + ' -> ' + k.keys[j] + ': ' + w.toFixed(3);
      if (k.boundary !== null && j === k.boundary - 1) td.classList.add('memory');
      td.onmouseenter = () => show(i, null);
    });
  });
  $('info').textContent = 'hover a token to see its weights';
}
function show(i, j) {
  const k = kind(), m = matrix(), info = $('info');
  info.innerHTML = '';
  const lead = document.createElement('b');
  lead.textContent = i !== null ? k.queries[i] + ' attends to: ' : 'attention paid to ' + k.keys[j] + ' by: ';
  info.appendChild(lead);
  const tokens = i !== null ? k.keys : k.queries, weights = i !== null ? m[i] : m.map((row) => row[j]);
  tokens.forEach((tok, n) => {
    const span = document.createElement('span'); span.textContent = tok + ' ' + weights[n].toFixed(2);
    span.style.background = shade(weights[n]); span.style.color = weights[n] > 0.5 ? 'white' : 'black';
    info.appendChild(span);
  });
  for (const cell of $('grid').querySelectorAll('.on')) cell.classList.remove('on');
  const rows = $('grid').rows;
  if (i !== null) rows[i + 1].classList.add('on');
}
$('sentence').onchange = onSentence; $('kind').onchange = onKind; $('layer').onchange = draw; $('head').onchange = draw;
onSentence();
"""


def page(title: str, body: str, script: str = "") -> str:
    """A complete HTML document with the shared style inline; no external resources."""
    tail = f"<script>{script}</script>\n" if script else ""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n{tail}</body>\n</html>\n")


def embed_json(element_id: str, obj: Any) -> str:
    """JSON inside a <script> element; '</' is escaped so no token can close the element early."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def attention_data(views: list[AttentionView], digits: int = 4) -> dict[str, Any]:
    """The JSON the page embeds: per sentence, per kind, layers x heads x rows x columns of weights."""
    return {"sentences": [{
        "source": v.source, "output": v.output,
        "kinds": {kind: {"title": v.title(kind), "queries": v.queries[kind], "keys": v.keys[kind],
                         "boundary": v.boundary.get(kind), "layers": [m.round(digits).tolist() for m in layers]}
                  for kind, layers in v.maps.items()}} for v in views]}


def attention_html(views: list[AttentionView], path: str | Path, title: str = "attention") -> dict[str, Any]:
    """Write the interactive page for `views` at `path`; returns the data it embeds."""
    data = attention_data(views)
    options = "".join(f'<option value="{i}">{i + 1}: {html.escape(v.source)}</option>' for i, v in enumerate(views))
    body = f"""<h1>{html.escape(title)}</h1>
<div class="controls">
<label>sentence<select id="sentence">{options}</select></label>
<label>attention<select id="kind"></select></label>
<label>layer<select id="layer"></select></label>
<label>head<select id="head"></select></label>
</div>
<p>source: <b id="source"></b><br>output: <b id="output"></b></p>
<table class="attn" id="grid"></table>
<div id="info"></div>
{embed_json("attn-data", data)}"""
    atomic_write_text(path, page(title, body, SCRIPT))
    return data
