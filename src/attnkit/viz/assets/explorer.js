'use strict';
// The attention explorer: the data of attnkit.viz.explorer (embedded, or fetched from POST /explore when served) drawn
// as bertviz's head and model views, a heatmap and per-token summaries. Every drawn element carries data-* attributes
// with the indices and the weight it shows, so a test (or a curious user) can read back what is on screen.
(() => {
  const $ = (id) => document.getElementById(id);
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f',
                  '#bcbd22', '#17becf', '#393b79', '#637939', '#8c6d31', '#843c39', '#7b4173', '#3182bd'];
  const LINE_MIN = 0.005;  // head view: lighter lines are not drawn (invisible anyway)
  const THUMB_MIN = 0.02;  // model view thumbnails
  const ROW = 20;  // head view: pixels per token
  const state = {data: null, item: 0, hyp: 0, kind: null, view: 'head', layer: 0, head: 'mean', heads: [],
                 focus: null, pinned: false};

  const readJson = (id) => { const el = $(id); return el ? JSON.parse(el.textContent) : null; };
  const range = (n) => Array.from({length: n}, (_, i) => i);
  const color = (h) => COLORS[h % COLORS.length];
  const shade = (w) => 'rgba(48, 18, 140,' + Math.min(1, Math.max(0, w)).toFixed(3) + ')';
  const svg = (tag, attrs) => {
    const el = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    return el;
  };
  function fill(sel, items) {
    sel.innerHTML = '';
    for (const [value, text] of items) {
      const o = document.createElement('option'); o.value = value; o.textContent = text; sel.appendChild(o);
    }
  }
  function setState(s) { document.body.dataset.state = s; }
  function status(text, error) {
    $('status').textContent = text; $('status').className = error ? 'error' : '';
    if (error) setState('error');
  }

  // --- the arrays -------------------------------------------------------------------------------------------
  function current() {
    const item = state.data.items[state.item], hyp = item.hypotheses[state.hyp];
    return {item, hyp, k: hyp.kinds[state.kind]};
  }
  const nHeads = (k) => k.layers[0].length;
  function matrix(k, layer, head) {  // (Tq, Tk): one head, or the mean of all heads
    const heads = k.layers[layer];
    if (head !== 'mean') return heads[head];
    return heads[0].map((row, i) => row.map((_, j) => heads.reduce((s, m) => s + m[i][j], 0) / heads.length));
  }
  function entropy(row) { let e = 0; for (const w of row) if (w > 0) e -= w * Math.log2(w); return e; }  // bits
  function argmax(row) { let best = 0; row.forEach((w, j) => { if (w > row[best]) best = j; }); return best; }

  // --- selection --------------------------------------------------------------------------------------------
  function load(data) {
    state.data = data; state.item = 0; state.hyp = 0;
    $('explorer').hidden = false;
    $('model-line').textContent = 'model: ' + data.model + (data.task === 'lm' ? ' (language model)' : '');
    fill($('item'), data.items.map((it, i) => [i, (i + 1) + ': ' + it.source]));
    $('item-label').hidden = data.items.length < 2;
    onItem();
  }
  function onItem() {
    state.item = +$('item').value || 0;
    const item = state.data.items[state.item];
    fill($('hyp'), item.hypotheses.map((h, i) => [i, (i + 1) + '. ' + h.text +
      (h.score === null || h.score === undefined ? '' : '   (log-prob ' + h.score.toFixed(3) + ')')]));
    onHyp();
  }
  function onHyp() {
    state.hyp = +$('hyp').value || 0;
    const {item, hyp} = current();
    $('source').textContent = item.source; $('output').textContent = hyp.text;
    const terms = hyp.terms || [];  // a glossary's terms: which the hypothesis uses (\u2713) and which not (\u2717)
    $('terms').hidden = !terms.length;
    $('terms').textContent = 'glossary: ' + terms.map((t) => t.source + ' \u2192 ' + t.target + ' ' +
      (t.placed ? '\u2713' : '\u2717 ' + t.note)).join(' \u00b7 ');
    const kinds = Object.keys(hyp.kinds), keep = kinds.includes(state.kind) ? state.kind : kinds[0];
    fill($('kind'), kinds.map((k) => [k, hyp.kinds[k].title]));
    $('kind').value = keep;
    onKind();
  }
  function onKind() {
    state.kind = $('kind').value;
    const k = current().k, H = nHeads(k);
    fill($('layer'), k.layers.map((_, i) => [i, 'layer ' + (i + 1)]));
    state.layer = Math.min(state.layer, k.layers.length - 1); $('layer').value = state.layer;
    fill($('head'), [['mean', 'mean of heads']].concat(range(H).map((h) => [h, 'head ' + (h + 1)])));
    if (state.head !== 'mean' && state.head >= H) state.head = 'mean';
    $('head').value = state.head;
    if (state.heads.length !== H) state.heads = range(H).map(() => true);
    state.focus = null; state.pinned = false;
    headBoxes(); draw();
  }
  function headBoxes() {
    const box = $('headboxes'); box.innerHTML = '';
    state.heads.forEach((on, h) => {
      const b = document.createElement('span');
      b.className = 'headbox' + (on ? '' : ' off'); b.dataset.head = h; b.style.background = color(h);
      b.title = 'head ' + (h + 1) + ': click to show or hide, double-click to show only this one';
      b.onclick = () => { state.heads[h] = !state.heads[h]; headBoxes(); draw(); };
      b.ondblclick = () => { state.heads = state.heads.map((_, g) => g === h); headBoxes(); draw(); };
      box.appendChild(b);
    });
  }
  function setView(v) {
    state.view = v;
    for (const b of document.querySelectorAll('#views button')) b.classList.toggle('on', b.dataset.view === v);
    for (const name of ['head', 'model', 'heatmap', 'summary']) $('view-' + name).hidden = name !== v;
    $('head-label').hidden = v !== 'heatmap';
    $('headboxes').hidden = v !== 'head';
    $('layer-label').hidden = v === 'model';
    draw();
  }
  function draw() {
    const k = current().k;
    const hints = {
      head: 'lines: how much each query token (left) attends to each key token (right), one colour per head; ' +
            'hover a token to see only its lines, click it to keep them',
      model: 'every layer (rows) and head (columns); click one to enlarge it in the head view',
      heatmap: 'rows: queries, columns: keys; hover a row to read its weights',
      summary: 'for each query token: each head\u2019s most attended key and the entropy of its weights (bits)'};
    $('hint').textContent = hints[state.view] + (k.boundary ? '; keys left of the dashed line are the memory' : '');
    ({head: drawHead, model: drawModel, heatmap: drawHeatmap, summary: drawSummary})[state.view](k);
  }

  // --- head view (bertviz): lines from queries to keys ----------------------------------------------------
  function drawHead(k) {
    const box = $('headview'); box.innerHTML = '';
    const left = k.queries, right = k.keys, width = 560, xl = 190, xr = 370;
    const offset = Math.max(0, (right.length - left.length) / 2) * ROW;  // centre the shorter column
    const top = 18, yl = (i) => top + offset + i * ROW, yr = (j) => top + j * ROW;
    box.setAttribute('width', width);
    box.setAttribute('height', top + Math.max(left.length, right.length) * ROW);
    const lines = svg('g', {class: 'lines'}); box.appendChild(lines);
    const focus = state.focus;
    state.heads.forEach((on, h) => {
      if (!on) return;
      k.layers[state.layer][h].forEach((row, i) => {
        if (focus && focus.side === 'q' && focus.index !== i) return;
        row.forEach((w, j) => {
          if (w < LINE_MIN || (focus && focus.side === 'k' && focus.index !== j)) return;
          lines.appendChild(svg('line', {class: 'attn', x1: xl + 6, y1: yl(i) - 4, x2: xr - 6, y2: yr(j) - 4,
            stroke: color(h), 'stroke-opacity': w.toFixed(4), 'stroke-width': 2,
            'data-head': h, 'data-i': i, 'data-j': j, 'data-w': w.toFixed(4)}));
        });
      });
    });
    const token = (text, x, y, side, index) => {
      const t = svg('text', {class: 'tok ' + (side === 'q' ? 'left' : 'right'), x, y,
        'text-anchor': side === 'q' ? 'end' : 'start', 'data-index': index});
      t.textContent = text;
      if (side === 'k' && k.boundary && index < k.boundary) t.classList.add('memory');
      if (focus && focus.side === side && focus.index === index) t.classList.add('focus');
      t.onmouseenter = () => { if (!state.pinned) { state.focus = {side, index}; drawHead(k); } };
      t.onmouseleave = () => { if (!state.pinned) { state.focus = null; drawHead(k); } };
      t.onclick = () => {
        const same = state.pinned && focus && focus.side === side && focus.index === index;
        state.pinned = !same; state.focus = same ? null : {side, index}; drawHead(k);
      };
      box.appendChild(t);
    };
    left.forEach((tok, i) => token(tok, xl, yl(i), 'q', i));
    right.forEach((tok, j) => token(tok, xr, yr(j), 'k', j));
    if (k.boundary) {
      const y = yr(k.boundary) - ROW + 5;
      box.appendChild(svg('line', {class: 'boundary', x1: xr - 4, y1: y, x2: width - 10, y2: y}));
    }
  }

  // --- model view (bertviz): every layer x head ----------------------------------------------------------
  function drawModel(k) {
    const grid = $('modelview'); grid.innerHTML = '';
    const H = nHeads(k), nq = k.queries.length, nk = k.keys.length, w = 84, rowH = 84 / Math.max(nq, nk, 1);
    grid.style.gridTemplateColumns = 'repeat(' + H + ', ' + (w + 8) + 'px)';
    k.layers.forEach((heads, layer) => heads.forEach((m, h) => {
      const cell = document.createElement('div');
      cell.className = 'thumb'; cell.dataset.layer = layer; cell.dataset.head = h;
      cell.title = 'layer ' + (layer + 1) + ', head ' + (h + 1) + ': click to enlarge';
      const pic = svg('svg', {width: w, height: w});
      m.forEach((row, i) => row.forEach((v, j) => {
        if (v < THUMB_MIN) return;
        pic.appendChild(svg('line', {x1: 10, y1: (i + 0.5) * rowH, x2: w - 10, y2: (j + 0.5) * rowH,
          stroke: color(h), 'stroke-opacity': v.toFixed(3), 'stroke-width': 1}));
      }));
      cell.appendChild(pic);
      const label = document.createElement('div'); label.textContent = 'L' + (layer + 1) + ' H' + (h + 1);
      cell.appendChild(label);
      cell.onclick = () => {
        state.layer = layer; $('layer').value = layer; state.focus = null; state.pinned = false;
        state.heads = range(H).map((g) => g === h); headBoxes(); setView('head');
      };
      grid.appendChild(cell);
    }));
  }

  // --- heatmap ---------------------------------------------------------------------------------------------
  function drawHeatmap(k) {
    const m = matrix(k, state.layer, state.head), table = $('grid');
    table.innerHTML = '';
    const head = table.insertRow(); head.appendChild(document.createElement('th'));
    k.keys.forEach((tok, j) => {
      const th = document.createElement('th'); th.className = 'key'; th.textContent = tok;
      th.onmouseenter = () => show(k, m, null, j); head.appendChild(th);
    });
    m.forEach((row, i) => {
      const tr = table.insertRow(), th = document.createElement('th');
      th.textContent = k.queries[i]; th.onmouseenter = () => show(k, m, i, null); tr.appendChild(th);
      row.forEach((w, j) => {
        const td = tr.insertCell(); td.style.background = shade(w);
        td.dataset.i = i; td.dataset.j = j; td.dataset.w = w.toFixed(4);
        td.title = k.queries[i] + ' \u2192 ' + k.keys[j] + ': ' + w.toFixed(3);
        if (k.boundary && j === k.boundary - 1) td.classList.add('memory-edge');
        td.onmouseenter = () => show(k, m, i, null);
      });
    });
    $('info').textContent = 'hover a token to read its weights';
  }
  function show(k, m, i, j) {
    const info = $('info'); info.innerHTML = '';
    const lead = document.createElement('b');
    lead.textContent = i !== null ? k.queries[i] + ' attends to: ' : 'attention paid to ' + k.keys[j] + ' by: ';
    info.appendChild(lead);
    const tokens = i !== null ? k.keys : k.queries, weights = i !== null ? m[i] : m.map((row) => row[j]);
    tokens.forEach((tok, n) => {
      const span = document.createElement('span'); span.textContent = tok + ' ' + weights[n].toFixed(2);
      span.style.background = shade(weights[n]); span.style.color = weights[n] > 0.5 ? 'white' : 'black';
      info.appendChild(span);
    });
    for (const row of $('grid').querySelectorAll('tr.on')) row.classList.remove('on');
    if (i !== null) $('grid').rows[i + 1].classList.add('on');
  }

  // --- per-token summaries -------------------------------------------------------------------------------------
  function drawSummary(k) {
    const table = $('summary'), H = nHeads(k), heads = k.layers[state.layer];
    table.innerHTML = '';
    const top = table.insertRow();
    const cellOf = (tr, tag, text, cls) => {
      const c = document.createElement(tag); c.textContent = text; if (cls) c.className = cls; tr.appendChild(c);
      return c;
    };
    cellOf(top, 'th', 'query');
    range(H).forEach((h) => { cellOf(top, 'th', 'head ' + (h + 1) + ': arg-max').style.color = color(h);
                              cellOf(top, 'th', 'entropy'); });
    cellOf(top, 'th', 'mean of heads: arg-max'); cellOf(top, 'th', 'entropy');
    const mean = matrix(k, state.layer, 'mean');
    k.queries.forEach((tok, i) => {
      const tr = table.insertRow(); tr.dataset.i = i;
      cellOf(tr, 'th', tok);
      const add = (row, h) => {
        const a = cellOf(tr, 'td', k.keys[argmax(row)], 'argmax'), e = cellOf(tr, 'td', entropy(row).toFixed(3), 'entropy');
        a.dataset.head = h; a.dataset.j = argmax(row); e.dataset.head = h;
      };
      range(H).forEach((h) => add(heads[h][i], h));
      add(mean[i], 'mean');
    });
  }

  // --- the live page: ask the server ----------------------------------------------------------------------------
  function setupLive(live) {
    $('ask').hidden = false;
    if (live.task === 'lm') {
      $('go').textContent = 'read'; $('lm-controls').hidden = false;
      $('beam-label').hidden = true; $('nbest-label').hidden = true; $('glossary').hidden = true;
      $('text').placeholder = 'type some text for the language model to read or continue';
    } else {
      $('beam').max = live.max_beam; $('nbest').max = live.max_beam;
    }
    $('ask').onsubmit = (e) => { e.preventDefault(); explore(live); };
    $('generate').onclick = () => generate();
  }
  async function post(path, body, accept) {
    return fetch(path, {method: 'POST', headers: {'Content-Type': 'application/json', Accept: accept},
                        body: JSON.stringify(body)});
  }
  async function explore(live) {
    setState('busy'); status('working\u2026');
    const text = $('text').value;
    const body = live.task === 'lm' ? {text} : {text, beam: +$('beam').value, nbest: +$('nbest').value};
    const glossary = $('glossary').value.split('\n').filter((l) => l.trim())
      .map((l) => l.includes('\t') ? l.split('\t') : l.split('='));
    if (live.task !== 'lm' && glossary.length) body.glossary = glossary.map((p) => p.map((s) => s.trim()));
    try {
      const r = await post('explore', body, 'application/json'), out = await r.json();
      if (!r.ok) { status(out.error || r.statusText, true); return; }
      load(out); status(''); setState('ready');
    } catch (e) { status(String(e), true); }
  }
  async function generate() {
    const out = $('stream'), prompt = $('text').value;
    out.hidden = false; out.textContent = prompt; out.dataset.state = 'streaming';
    setState('busy'); status('sampling\u2026');
    const body = {prompt, length: +$('length').value, temperature: +$('temperature').value, seed: +$('seed').value};
    try {
      const r = await post('generate', body, 'text/event-stream');
      if (!r.ok) { const e = await r.json(); status(e.error || r.statusText, true); return; }
      const reader = r.body.getReader(), decoder = new TextDecoder();
      let buffer = '', count = 0;
      const handle = (block) => {
        let event = 'message', data = '';
        for (const line of block.split('\n')) {
          if (line.startsWith('event: ')) event = line.slice(7);
          else if (line.startsWith('data: ')) data += line.slice(6);
        }
        const payload = data ? JSON.parse(data) : {};
        if (event === 'token') { out.textContent += payload.text; count += 1; out.dataset.tokens = count; }
        else if (event === 'done') { out.textContent = prompt + payload.text; out.dataset.state = 'done'; }
        else if (event === 'error') status(payload.error, true);
      };
      for (;;) {
        const {done, value} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true});
        let cut;
        while ((cut = buffer.indexOf('\n\n')) >= 0) { handle(buffer.slice(0, cut)); buffer = buffer.slice(cut + 2); }
      }
      if (out.dataset.state === 'done') { status(''); setState('ready'); }
    } catch (e) { status(String(e), true); }
  }

  $('item').onchange = onItem; $('hyp').onchange = onHyp; $('kind').onchange = onKind;
  $('layer').onchange = () => { state.layer = +$('layer').value; state.focus = null; state.pinned = false; draw(); };
  $('head').onchange = () => { state.head = $('head').value === 'mean' ? 'mean' : +$('head').value; draw(); };
  for (const b of document.querySelectorAll('#views button')) b.onclick = () => setView(b.dataset.view);
  const live = readJson('explorer-live'), data = readJson('explorer-data');
  if (live) setupLive(live);
  if (data) load(data);
  setState('ready');
})();
