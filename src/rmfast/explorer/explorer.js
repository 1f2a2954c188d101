// rmfast explorer: plain JS, no library, no network. The data block is described in rmfast/explore.py.
"use strict";
(function () {
  const ROW_H = 22, OVERSCAN = 8, MOVERS = 10, BINS = 48;
  const $ = (id) => document.getElementById(id);
  const fmtInt = new Intl.NumberFormat("en-US");
  const S = { sortKey: "c0", sortDir: 1, query: "", textMask: null, selected: -1, view: new Int32Array(0),
              nView: 0, orders: {}, shiftOn: false, lastUpdateMs: NaN, lastSearchMs: NaN };

  // ------------------------------------------------------------------ decoding
  function b64bytes(b64) {
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(b64);
    const bin = atob(b64), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  async function gunzip(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  const CTORS = { float32: Float32Array, int32: Int32Array, uint8: Uint8Array, uint32: Uint32Array };
  async function decode() {
    const el = $("rmx-data");
    let bytes = b64bytes(el.textContent.trim());
    if (el.dataset.gzip === "1") bytes = await gunzip(bytes);
    const magic = String.fromCharCode(bytes[0], bytes[1], bytes[2], bytes[3]);
    if (magic !== "RMX1") throw new Error("not an rmfast explorer data block");
    const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const hlen = dv.getUint32(4, true);
    const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + hlen)));
    let base = 8 + hlen; base += (8 - base % 8) % 8;
    const arrays = {};
    for (const a of header.arrays) {  // byte planes back to little-endian elements
      const C = CTORS[a.dtype], w = C.BYTES_PER_ELEMENT, n = a.length, out = new Uint8Array(n * w);
      const src = bytes.subarray(base + a.offset, base + a.offset + n * w);
      for (let b = 0; b < w; b++) { const plane = src.subarray(b * n, (b + 1) * n); for (let i = 0, o = b; i < n; i++, o += w) out[o] = plane[i]; }
      arrays[a.name] = new C(out.buffer);
    }
    return { header, arrays };
  }

  // ------------------------------------------------------------------ text display (as report.visible)
  function visible(s) {
    if (s === "") return "∅";
    const core = s.replace(/^ +| +$/g, "");
    const lead = s.length - s.replace(/^ +/, "").length;
    const trail = core ? s.length - s.replace(/ +$/, "").length : 0;
    // what Python's str.isprintable() rejects (control, format, separators but the space, unassigned), as repr()
    // writes it: an NBSP or a zero-width space is as visible here as in the report
    const esc = core.replace(/[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/gu, (c) => {
      if (c === " ") return c;
      const named = { "\n": "\\n", "\t": "\\t", "\r": "\\r" }[c];
      if (named) return named;
      const cp = c.codePointAt(0), hex = (w) => cp.toString(16).padStart(w, "0");
      return cp < 0x100 ? "\\x" + hex(2) : cp < 0x10000 ? "\\u" + hex(4) : "\\U" + hex(8);
    });
    return "␣".repeat(lead) + esc + "␣".repeat(trail);
  }
  // Every score with 3 decimals, so a column reads "-6.000" beside "-6.026" (4 significant digits with the
  // trailing zeros cut printed "-6" there). The one score format: table, captions, and rmx.fmtScore.
  const fmtScore = (v) => (Number.isNaN(v) ? "" : v.toFixed(3));
  const shortModel = (m) => m.split("/").pop();

  // ------------------------------------------------------------------ orders (row indices, present rows first)
  function rankOrder(c) {  // counting sort on the scan's rank: O(N), stable by row
    const r = S.ranks[c], n = S.n;
    let max = 0;
    for (let i = 0; i < n; i++) if (r[i] > max) max = r[i];
    const count = new Int32Array(max + 2);
    for (let i = 0; i < n; i++) count[r[i] === 0 ? max + 1 : r[i]]++;
    let acc = 0;
    for (let k = 1; k <= max + 1; k++) { const t = count[k]; count[k] = acc; acc += t; }
    const idx = new Int32Array(n);
    for (let i = 0; i < n; i++) idx[count[r[i] === 0 ? max + 1 : r[i]]++] = i;
    return { idx, nPresent: n - (count[max + 1] - count[max]) };
  }
  function keyOrder(key, present) {  // generic sort by a numeric key, absent rows last
    const idx = [], miss = [];
    for (let i = 0; i < S.n; i++) (present(i) ? idx : miss).push(i);
    idx.sort((a, b) => key[a] - key[b] || a - b);
    const out = new Int32Array(S.n);
    out.set(idx); out.set(miss, idx.length);
    return { idx: out, nPresent: idx.length };
  }
  function order(key) {
    if (S.orders[key]) return S.orders[key];
    let o;
    if (key[0] === "c") o = rankOrder(+key.slice(1));
    else if (key === "text") {
      const idx = Array.from({ length: S.n }, (_, i) => i), t = S.texts;
      idx.sort((a, b) => (t[a] < t[b] ? -1 : t[a] > t[b] ? 1 : a - b));
      o = { idx: Int32Array.from(idx), nPresent: S.n };
    } else if (key === "id") o = keyOrder(S.idKey, (i) => S.idKey[i] >= 0);
    else if (key === "shift") o = keyOrder(S.shift.negDelta, (i) => S.shift.has[i]);
    return (S.orders[key] = o);
  }

  // ------------------------------------------------------------------ filtering
  function searchMask(q) {
    const out = new Uint8Array(S.n);
    const m = /^\/(.+)\/([a-z]*)$/.exec(q);
    if (m) {
      let re;
      try { re = new RegExp(m[1], m[2].replace(/[gy]/g, "")); } catch (e) { return { error: e.message }; }
      for (let i = 0; i < S.n; i++) out[i] = re.test(S.texts[i]) || re.test(S.idStr[i]) ? 1 : 0;
    } else {
      const ql = q.toLowerCase(), low = S.low;
      if (/^[0-9 ]+$/.test(ql)) { for (let i = 0; i < S.n; i++) out[i] = low[i].includes(ql) || S.idStr[i].includes(ql) ? 1 : 0; }
      else { for (let i = 0; i < S.n; i++) out[i] = low[i].includes(ql) ? 1 : 0; }  // ids hold only digits
    }
    return { mask: out };
  }
  function readFilters() {
    const rmin = parseInt($("f-rmin").value, 10), rmax = parseInt($("f-rmax").value, 10);
    return { word: $("f-word").checked, special: $("f-special").value, cat: $("f-cat").value,
             rcol: +$("f-rcol").value, rmin: Number.isFinite(rmin) ? rmin : 1,
             rmax: Number.isFinite(rmax) ? rmax : Infinity };
  }
  function computeMask() {  // S.mask[i] = 1 where row i passes every filter; null when nothing filters
    const f = readFilters(), n = S.n, fl = S.flags, cats = S.cats;
    const catBit = f.cat === "" ? -1 : f.cat === "any" ? -2 : f.cat === "none" ? -3 : +f.cat;
    const ranged = f.rmin > 1 || f.rmax < Infinity;
    if (!S.textMask && !f.word && f.special === "all" && catBit === -1 && !ranged) { S.mask = null; return; }
    const m = S.maskBuf || (S.maskBuf = new Uint8Array(n));
    if (S.textMask) m.set(S.textMask); else m.fill(1);
    if (f.word) for (let i = 0; i < n; i++) m[i] &= fl[i] & 1;
    if (f.special === "hide") for (let i = 0; i < n; i++) m[i] &= (~fl[i] >> 1) & 1;
    if (f.special === "only") for (let i = 0; i < n; i++) m[i] &= (fl[i] >> 1) & 1;
    if (catBit === -2) for (let i = 0; i < n; i++) m[i] &= cats[i] !== 0 ? 1 : 0;
    if (catBit === -3) for (let i = 0; i < n; i++) m[i] &= cats[i] === 0 ? 1 : 0;
    if (catBit >= 0) for (let i = 0; i < n; i++) m[i] &= (cats[i] >>> catBit) & 1;
    if (ranged) {
      const r = S.ranks[f.rcol], lo = f.rmin, hi = f.rmax;
      for (let i = 0; i < n; i++) { const v = r[i]; if (v === 0 || v < lo || v > hi) m[i] = 0; }
    }
    S.mask = m;
  }
  function passFn() { const m = S.mask; return m ? (i) => m[i] === 1 : () => true; }
  function rebuildView() {
    const o = order(S.sortKey), idx = o.idx, m = S.mask, view = S.view.length === S.n ? S.view : new Int32Array(S.n);
    let k = 0;
    const take = (j) => { const i = idx[j]; if (!m || m[i]) view[k++] = i; };
    if (S.sortDir === 1) for (let j = 0; j < o.nPresent; j++) take(j);
    else for (let j = o.nPresent - 1; j >= 0; j--) take(j);
    for (let j = o.nPresent; j < S.n; j++) take(j);
    S.view = view; S.nView = k;
  }

  // ------------------------------------------------------------------ the grid
  function fitToken() {  // the token column takes the room the numbers leave, within 160..360 px
    S.idW = S.ids.length > 1 ? 112 : 64;  // room for two ids where tokenizers differ (all in the tooltip)
    const fixed = (S.hasIds ? S.idW : 0) + 66 + 142 * S.C + 18;
    S.tokenW = Math.max(160, Math.min(420, $("viewport").clientWidth - fixed));
  }
  function gridTemplate() {
    const cols = [S.tokenW + "px"];
    if (S.hasIds) cols.push(S.idW + "px");
    if (S.shiftOn) cols.push("66px");
    for (let c = 0; c < S.C; c++) cols.push("70px", "72px");
    return cols.join(" ");
  }
  function headCell(text, sub, key, cls, title) {
    const d = document.createElement("div");
    d.className = "hcell " + (cls || "");
    d.dataset.key = key;
    d.textContent = text;
    if (sub !== null) { const s = document.createElement("span"); s.className = "sub"; s.textContent = sub; d.appendChild(s); }
    if (title) d.title = title;
    return d;
  }
  function buildHead() {
    const h = $("thead");
    h.textContent = "";
    const r = document.createElement("div");
    r.className = "hrow"; r.style.gridTemplateColumns = gridTemplate();
    r.appendChild(headCell("token", "decoded text", "text", "", "sort by text"));
    if (S.hasIds) r.appendChild(headCell("id", S.H.join === "text" ? "per tokenizer" : "token id", "id", "num", "sort by token id"));
    if (S.shiftOn) r.appendChild(headCell("Δ rank", `${S.cols[S.shift.a].label}→${S.cols[S.shift.b].label}`, "shift", "num",
      "rank under A minus rank under B, both ranked on the rows they share (positive: higher under B)"));
    S.cols.forEach((c, k) => {
      const t = `${c.model}\n${c.prompt}${c.candidates ? "\n" + c.candidates : ""}\nclick: best first; again: worst first`;
      const a = headCell(`${c.label} · ${shortModel(c.model)}`, c.prompt, "c" + k, "", t);
      a.style.gridColumn = "span 2";
      r.appendChild(a);
    });
    h.appendChild(r);
    markSorted();
  }
  function markSorted() {
    for (const el of $("thead").querySelectorAll(".hcell")) {
      const on = el.dataset.key === S.sortKey;
      el.classList.toggle("sorted", on);
      const base = el.firstChild.textContent.replace(/ [▲▼]$/, "");
      el.firstChild.textContent = on ? base + (S.sortDir === 1 ? " ▼" : " ▲") : base;
    }
  }
  const pool = [];
  function rowEl() {
    const r = document.createElement("div");
    r.className = "row";
    const ncell = 1 + (S.hasIds ? 1 : 0) + (S.shiftOn ? 1 : 0) + 2 * S.C;
    for (let k = 0; k < ncell; k++) r.appendChild(document.createElement("div"));
    r.children[0].className = "tok";
    for (let k = 1; k < ncell; k++) r.children[k].className = "n";
    r.addEventListener("click", () => select(+r.dataset.i));
    return r;
  }
  function resetPool() { pool.length = 0; $("rows").textContent = ""; }
  function render() {
    const vp = $("viewport"), rows = $("rows");
    $("spacer").style.height = S.nView * ROW_H + "px";
    const first = Math.max(0, Math.floor(vp.scrollTop / ROW_H) - OVERSCAN);
    const count = Math.min(S.nView - first, Math.ceil(vp.clientHeight / ROW_H) + 2 * OVERSCAN);
    while (pool.length < count) { const r = rowEl(); pool.push(r); rows.appendChild(r); }
    const tpl = gridTemplate();
    for (let k = 0; k < pool.length; k++) {
      const r = pool[k];
      if (k >= count) { r.style.display = "none"; continue; }
      const i = S.view[first + k];
      r.style.display = ""; r.style.top = (first + k) * ROW_H + "px"; r.style.gridTemplateColumns = tpl;
      r.dataset.i = i;
      r.classList.toggle("selected", i === S.selected);
      const cells = r.children;
      cells[0].textContent = visible(S.texts[i]);
      cells[0].title = JSON.stringify(S.texts[i]);
      let j = 1;
      if (S.hasIds) { cells[j].textContent = S.idStr[i]; cells[j++].title = S.idStr[i]; }
      if (S.shiftOn) {
        const d = S.shift.delta[i], has = S.shift.has[i];
        cells[j].textContent = has ? (d > 0 ? "+" : "") + fmtInt.format(d) : "";
        cells[j].className = "n " + (!has ? "" : d > 0 ? "up" : d < 0 ? "down" : "");
        j++;
      }
      for (let c = 0; c < S.C; c++) {
        const v = S.scores[c][i], rk = S.ranks[c][i];
        cells[j].textContent = rk ? fmtScore(v) : "—";
        cells[j++].className = rk ? "n" : "n na";
        cells[j++].textContent = rk ? "#" + fmtInt.format(rk) : "";
      }
    }
  }
  let raf = 0;
  const scheduleRender = () => { if (!raf) raf = requestAnimationFrame(() => { raf = 0; render(); }); };

  // ------------------------------------------------------------------ update cycle
  function update(opts) {
    const t0 = performance.now();
    if (opts && opts.search) {
      // as typed, never trimmed: " love" is the word-start token, not "love" too; "␣" (what the grid shows) is a space
      const q = $("q").value.replace(/␣/g, " ");
      S.query = q;
      const res = q !== "" ? searchMask(q) : { mask: null };
      $("q").classList.toggle("bad", !!res.error);
      S.searchError = res.error || "";
      S.textMask = res.error ? null : res.mask;
    }
    computeMask();
    rebuildView();
    if (opts && opts.top) $("viewport").scrollTop = 0;
    render();
    if (S.shift) renderMovers();
    const ms = performance.now() - t0;
    S.lastUpdateMs = ms;
    if (opts && opts.search) S.lastSearchMs = ms;
    $("status").innerHTML = "";
    $("status").textContent = `${fmtInt.format(S.nView)} of ${fmtInt.format(S.n)} rows · ${ms.toFixed(1)} ms`;
    if (S.searchError) { const e = document.createElement("span"); e.className = "err"; e.textContent = " · regex: " + S.searchError; $("status").appendChild(e); }
    if (S.selected < 0 && S.nView) select(S.view[0]);
    return ms;
  }
  function sortBy(key) {
    if (S.sortKey === key) S.sortDir = -S.sortDir; else { S.sortKey = key; S.sortDir = 1; }
    markSorted();
    update({ top: true });
  }

  // ------------------------------------------------------------------ selected token + histograms
  function histograms() {
    S.hist = S.scores.map((s) => {
      let lo = Infinity, hi = -Infinity;
      for (let i = 0; i < s.length; i++) { const v = s[i]; if (v < lo) lo = v; if (v > hi) hi = v; }
      const counts = new Float64Array(BINS), w = (hi - lo) / BINS || 1;
      for (let i = 0; i < s.length; i++) { const v = s[i]; if (v === v) counts[Math.min(BINS - 1, Math.floor((v - lo) / w))]++; }
      return { lo, hi, counts, max: Math.max(...counts) };
    });
    const box = $("hists");
    S.cols.forEach((c, k) => {
      const d = document.createElement("div");
      d.className = "hist";
      d.innerHTML = `<div class="cap"><b></b><span></span></div><canvas></canvas>`;
      d.querySelector("b").textContent = `${c.label} · ${shortModel(c.model)}`;
      d.querySelector("b").title = `${c.model} — ${c.prompt}`;
      box.appendChild(d);
      S.hist[k].el = d;
    });
  }
  function drawHist(k, value) {
    const h = S.hist[k], cv = h.el.querySelector("canvas"), dpr = window.devicePixelRatio || 1;
    const W = cv.clientWidth || 300, Hh = cv.clientHeight || 40;
    cv.width = W * dpr; cv.height = Hh * dpr;
    const g = cv.getContext("2d");
    g.scale(dpr, dpr);
    g.fillStyle = "#9aa7bd";
    const bw = W / BINS;
    for (let b = 0; b < BINS; b++) {
      const y = h.max ? Math.sqrt(h.counts[b] / h.max) * (Hh - 4) : 0;  // sqrt: the tails stay visible
      g.fillRect(b * bw + 0.5, Hh - y, Math.max(1, bw - 1), y);
    }
    const cap = h.el.querySelector("span");
    if (value === value && h.hi > h.lo) {
      const x = ((value - h.lo) / (h.hi - h.lo)) * (W - 2) + 1;
      g.fillStyle = "#d0312d"; g.fillRect(x - 1, 0, 2, Hh);
      const rk = S.ranks[k][S.selected];
      // out of the rows ranked: a column's ranks leave out its duplicated strings
      cap.textContent = `${fmtScore(value)} · #${fmtInt.format(rk)} / ${fmtInt.format(S.cols[k].rows - S.cols[k].duplicated)}`;
    } else cap.textContent = S.selected >= 0 ? "absent" : "";
  }
  function select(i) {
    S.selected = i;
    for (const r of pool) r.classList.toggle("selected", +r.dataset.i === i);
    const b = $("sel-body");
    b.className = "";
    b.textContent = "";
    if (i < 0) return;
    const big = document.createElement("div"); big.className = "big"; big.textContent = visible(S.texts[i]);
    b.appendChild(big);
    const info = document.createElement("div"); info.className = "muted";
    const tags = [];
    if (S.flags[i] & 1) tags.push("word-like");
    if (S.flags[i] & 2) tags.push("special");
    S.catNames.forEach((n, k) => { if ((S.cats[i] >>> k) & 1) tags.push(n); });
    const ids = S.H.id_groups.map((g, k) => (S.ids[k][i] >= 0 ? (S.H.join === "text" ? shortModel(g) + ": " : "") + S.ids[k][i] : null)).filter((x) => x !== null);
    info.textContent = `id ${ids.join(", ") || "—"}${tags.length ? " · " + tags.join(" · ") : ""}`;
    b.appendChild(info);
    S.cols.forEach((c, k) => drawHist(k, S.scores[k][i]));
  }

  // ------------------------------------------------------------------ shift view
  function computeShift(a, b) {
    // Both columns re-ranked on the rows they share (1 = best, ties share the best rank): rank_a - rank_b.
    const n = S.n, has = new Uint8Array(n), delta = new Int32Array(n), negDelta = new Float64Array(n);
    for (let i = 0; i < n; i++) has[i] = S.scores[a][i] === S.scores[a][i] && S.scores[b][i] === S.scores[b][i] ? 1 : 0;
    const rankOn = (c) => {
      const o = order("c" + c), out = new Int32Array(n), s = S.scores[c];
      let pos = 0, prev = NaN, prevRank = 0;
      for (let j = 0; j < o.nPresent; j++) {
        const i = o.idx[j];
        if (!has[i]) continue;
        pos++;
        if (s[i] !== prev) { prevRank = pos; prev = s[i]; }
        out[i] = prevRank;
      }
      return out;
    };
    const ra = rankOn(a), rb = rankOn(b);
    for (let i = 0; i < n; i++) if (has[i]) { delta[i] = ra[i] - rb[i]; negDelta[i] = -delta[i]; }
    S.shift = { a, b, has, delta, negDelta };
    delete S.orders.shift;
  }
  function pairStats(a, b) {
    const lo = Math.min(a, b), hi = Math.max(a, b);
    return S.H.pairs.find((p) => p.a === lo && p.b === hi);
  }
  function renderShift() {
    const a = +$("s-a").value, b = +$("s-b").value;
    computeShift(a, b);
    for (const el of document.querySelectorAll(".sb")) el.textContent = S.cols[b].label;
    const p = pairStats(a, b), box = $("s-stats");
    const f = (v, d) => (v === null || v === undefined ? "—" : v.toFixed(d));
    box.innerHTML = "";
    const t = document.createElement("table");
    const rows = a === b ? [["same column", ""]] : [
      ["shared rows", fmtInt.format(p ? p.n_shared : 0)],
      ["Kendall τ-b", f(p && p.kendall_tau_b, 4)],
      ["Spearman ρ", f(p && p.spearman_rho, 4)],
      [`RBO (p = ${S.H.rbo_p})`, f(p && p.rbo, 4)]];
    for (const [k, v] of rows) { const tr = t.insertRow(); tr.insertCell().textContent = k; tr.insertCell().textContent = v; }
    t.id = "s-table";
    box.appendChild(t);
    if (S.shiftOn) { buildHead(); resetPool(); }
    if (S.sortKey === "shift") delete S.orders.shift;
    update();
  }
  function renderMovers() {
    const o = order("shift"), pass = passFn(), up = [], down = [];
    for (let j = 0; j < o.nPresent && up.length < MOVERS; j++) { const i = o.idx[j]; if (S.shift.delta[i] > 0 && pass(i)) up.push(i); }
    for (let j = o.nPresent - 1; j >= 0 && down.length < MOVERS; j--) { const i = o.idx[j]; if (S.shift.delta[i] < 0 && pass(i)) down.push(i); }
    const fill = (el, list) => {
      el.textContent = "";
      for (const i of list) {
        const li = document.createElement("li"), d = S.shift.delta[i];
        li.innerHTML = `<span class="tok"></span> <span class="muted"></span>`;
        li.firstChild.textContent = visible(S.texts[i]);
        li.lastChild.textContent = (d > 0 ? "+" : "") + fmtInt.format(d);
        li.title = `rank ${fmtInt.format(S.ranks[S.shift.a][i])} → ${fmtInt.format(S.ranks[S.shift.b][i])} (scan ranks)`;
        li.addEventListener("click", () => { select(i); reveal(i); });
        el.appendChild(li);
      }
      if (!list.length) el.innerHTML = "<li class='muted'>none</li>";
    };
    fill($("s-up"), up); fill($("s-down"), down);
  }
  function reveal(i) {
    for (let k = 0; k < S.nView; k++) if (S.view[k] === i) { $("viewport").scrollTop = Math.max(0, k * ROW_H - 3 * ROW_H); render(); return; }
  }

  // ------------------------------------------------------------------ representations: the reward lens, the similarity maps
  // Every number comes from the header (rmfast.analysis.lens / similarity, computed in Python); the page only draws.
  const f3 = (v) => (v === null || v === undefined ? "—" : v.toFixed(3));
  const LENS_LINES = [["spearman", "Spearman with the final scores", "#1f77b4"], ["top_k_overlap", "top-k overlap", "#2ca02c"],
                      ["bottom_k_overlap", "bottom-k overlap", "#d62728"]];
  function option(sel, value, text) { const o = document.createElement("option"); o.value = value; o.textContent = text; sel.appendChild(o); }
  function reps() {
    const L = S.H.lens || [], M = S.H.similarity || [];
    if (!L.length && !M.length) return;
    $("reps").hidden = false;
    if (L.length) {
      L.forEach((l, k) => option($("lens-col"), k, `${S.cols[l.column].label} · ${shortModel(l.model)} · ${l.prompt}`));
      $("lens-col").addEventListener("input", () => drawLens(+$("lens-col").value));
      drawLens(0);
    } else $("lens-box").style.display = "none";
    if (M.length) {
      M.forEach((p, k) => option($("sim-pair"), k, p.source === "computed" ? `${shortModel(p.a)} × ${shortModel(p.b)}` : p.source));
      for (const m of Object.keys(M[0].measures)) option($("sim-measure"), m, m);
      $("sim-pair").addEventListener("input", drawSim);
      $("sim-measure").addEventListener("input", drawSim);
      drawSim();
    } else $("sim-box").style.display = "none";
  }
  function drawLens(k) {
    const l = S.H.lens[k], n = l.layers.length, t = document.createElement("table");
    t.id = "lens-tab";
    t.innerHTML = `<thead><tr><th class="t">layer</th><th>Spearman</th><th>top-${l.k}</th><th>bottom-${l.k}</th></tr></thead>`;
    const tb = t.createTBody();
    l.layers.forEach((name, i) => {
      const r = tb.insertRow();
      r.insertCell().textContent = name;
      for (const [key] of LENS_LINES) r.insertCell().textContent = f3(l[key][i]);
    });
    const box = $("lens-table");
    box.textContent = "";
    box.appendChild(t);
    for (const note of l.notes) { const q = document.createElement("p"); q.className = "muted"; q.textContent = note; box.appendChild(q); }
    $("lens-key").innerHTML = "";
    for (const [, label, colour] of LENS_LINES) {
      const s = document.createElement("span"); s.style.color = colour; s.textContent = "● " + label.replace("-k", "-" + l.k);
      $("lens-key").appendChild(s);
    }
    const cv = $("lens-plot"), dpr = window.devicePixelRatio || 1, W = cv.clientWidth || 300, Hh = cv.clientHeight || 150;
    cv.width = W * dpr; cv.height = Hh * dpr;
    const g = cv.getContext("2d"), pad = 6;
    g.scale(dpr, dpr);
    const X = (i) => pad + (n > 1 ? (i / (n - 1)) * (W - 2 * pad) : (W - 2 * pad) / 2), Y = (v) => pad + ((1 - v) / 2) * (Hh - 2 * pad);
    g.fillStyle = "#ccc"; g.fillRect(pad, Y(0), W - 2 * pad, 1);
    g.fillStyle = "#eee"; g.fillRect(pad, Y(1), W - 2 * pad, 1); g.fillRect(pad, Y(-1), W - 2 * pad, 1);
    for (const [key, , colour] of LENS_LINES) {
      g.strokeStyle = colour; g.fillStyle = colour; g.lineWidth = 1.5; g.beginPath();
      let on = false;
      l[key].forEach((v, i) => {
        if (v === null) { on = false; return; }
        if (on) g.lineTo(X(i), Y(v)); else g.moveTo(X(i), Y(v));
        on = true;
      });
      g.stroke();
      l[key].forEach((v, i) => { if (v !== null) g.fillRect(X(i) - 1.5, Y(v) - 1.5, 3, 3); });
    }
  }
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function colour(t) {
    const x = Math.max(0, Math.min(1, t)) * (VIRIDIS.length - 1), i = Math.min(VIRIDIS.length - 2, Math.floor(x)), f = x - i;
    const c = VIRIDIS[i].map((a, j) => Math.round(a + f * (VIRIDIS[i + 1][j] - a)));
    return { bg: `rgb(${c.join(",")})`, fg: t > 0.6 ? "#000" : "#fff" };
  }
  function drawSim() {
    const p = S.H.similarity[+$("sim-pair").value], m = $("sim-measure").value, v = p.measures[m];
    const lo = Math.min(0, ...v.flat().filter((x) => x !== null)), small = p.layers_b.length <= 8;
    const t = document.createElement("table");
    t.id = "sim-tab";
    const hr = t.createTHead().insertRow();
    hr.appendChild(document.createElement("th")).textContent = `${shortModel(p.a)} ↓ ${shortModel(p.b)} →`;
    for (const b of p.layers_b) hr.appendChild(document.createElement("th")).textContent = b;
    const tb = t.createTBody();
    p.layers_a.forEach((a, i) => {
      const r = tb.insertRow();
      r.appendChild(document.createElement("th")).textContent = a;
      p.layers_b.forEach((b, j) => {
        const x = v[i][j], td = r.insertCell();
        td.dataset.v = x === null ? "" : String(x);
        td.title = `${p.a} layer ${a} × ${p.b} layer ${b}: ${m} = ${f3(x)}`;
        if (x === null) return;
        const c = colour((x - lo) / (1 - lo || 1));
        td.style.background = c.bg; td.style.color = c.fg;
        if (small) td.textContent = x.toFixed(2);
      });
    });
    const box = $("sim-map");
    box.textContent = "";
    box.appendChild(t);
    $("sim-note").textContent = (p.source === "computed"
      ? `${p.layers_a.length} of ${p.all_a} layers × ${p.layers_b.length} of ${p.all_b} (evenly spaced, first and last kept); ` +
        "no bootstrap or permutations (rmfast analyze similarity gives every layer with intervals). "
      : `From ${p.source}. `) + (p.n ? `n = ${fmtInt.format(p.n)} candidates. ` : "") + `Colour: ${f3(lo)} to 1. ` + p.notes.join(" ");
  }

  // ------------------------------------------------------------------ legend, controls
  function legend() {
    const H = S.H, t = document.createElement("table");
    t.innerHTML = "<thead><tr><th class='t'></th><th class='t'>model / prompt</th><th>rows</th><th title='dropped: decoded string repeated within the scan'>dup.</th><th title='rows absent from at least one other column'>unmatched</th></tr></thead>";
    const tb = t.createTBody();
    S.cols.forEach((c) => {
      const r = tb.insertRow();
      r.insertCell().textContent = c.label;
      const m = r.insertCell(); m.className = "t";
      m.innerHTML = "<b></b><br><span class='muted'></span>";
      m.firstChild.textContent = c.model; m.lastChild.textContent = c.prompt + (c.candidates ? ` [${c.candidates}]` : "");
      for (const v of [c.rows, c.duplicated, c.unmatched]) r.insertCell().textContent = fmtInt.format(v);
    });
    const box = $("legend-body");
    box.appendChild(t);
    const p = document.createElement("p"); p.className = "muted";
    const unmatched = S.n - S.nShared;
    p.textContent = (H.join === "text" ? "Joined on decoded text (a string repeated within a scan is dropped there). "
      : "Joined on token id (one tokenizer). ") + `${fmtInt.format(S.n)} rows; ${fmtInt.format(unmatched)} not in every column.` +
      " Special: marker-shaped pieces (<|…|>, <pad>, <unused…>); the scans do not record the tokenizer's list." +
      (H.source ? ` Source: ${H.source}.` : "") + ` rmfast ${H.version}.`;
    box.appendChild(p);
    for (const n of H.notes) { const q = document.createElement("p"); q.className = "muted"; q.textContent = n; box.appendChild(q); }
  }
  function controls() {
    const colOpts = (sel, k0) => S.cols.forEach((c, k) => {
      const o = document.createElement("option");
      o.value = k; o.textContent = `${c.label} · ${shortModel(c.model)} · ${c.prompt}`; o.title = `${c.model} — ${c.prompt}`;
      if (k === k0) o.selected = true;
      sel.appendChild(o);
    });
    colOpts($("f-rcol"), 0); colOpts($("s-a"), 0); colOpts($("s-b"), Math.min(1, S.C - 1));
    const cat = $("f-cat");
    if (!S.catNames.length) $("f-cat-wrap").style.display = "none";
    for (const [v, t] of [["", "all"], ["any", "in any"], ["none", "in none"]].concat(S.catNames.map((n, k) => [String(k), n]))) {
      const o = document.createElement("option"); o.value = v; o.textContent = t; cat.appendChild(o);
    }
    $("q").addEventListener("input", () => update({ search: true, top: true }));
    for (const id of ["f-word", "f-special", "f-cat", "f-rcol", "f-rmin", "f-rmax"]) $(id).addEventListener("input", () => update({ top: true }));
    $("thead").addEventListener("click", (e) => { const h = e.target.closest(".hcell"); if (h) sortBy(h.dataset.key); });
    $("viewport").addEventListener("scroll", scheduleRender, { passive: true });
    window.addEventListener("resize", () => {
      const w = S.tokenW;
      fitToken();
      if (w !== S.tokenW) buildHead();
      scheduleRender();
      if (S.selected >= 0) select(S.selected);
    });
    $("s-a").addEventListener("input", renderShift);
    $("s-b").addEventListener("input", renderShift);
    $("s-on").addEventListener("input", () => {
      S.shiftOn = $("s-on").checked;
      if (!S.shiftOn && S.sortKey === "shift") { S.sortKey = "c0"; S.sortDir = 1; }
      buildHead(); resetPool(); update();
    });
    $("viewport").addEventListener("keydown", (e) => {
      if (e.key !== "ArrowDown" && e.key !== "ArrowUp") return;
      let k = 0;
      while (k < S.nView && S.view[k] !== S.selected) k++;
      k = Math.max(0, Math.min(S.nView - 1, k + (e.key === "ArrowDown" ? 1 : -1)));
      if (S.nView) { select(S.view[k]); reveal(S.view[k]); }
      e.preventDefault();
    });
  }

  // ------------------------------------------------------------------ start
  async function start() {
    const { header: H, arrays: A } = await decode();
    const n = H.n, C = H.columns.length;
    Object.assign(S, { H, n, C, cols: H.columns, texts: H.texts, flags: A.flags, cats: A.cats, catNames: H.categories });
    S.scores = Array.from({ length: C }, (_, c) => A.scores.subarray(c * n, (c + 1) * n));
    S.ranks = Array.from({ length: C }, (_, c) => A.ranks.subarray(c * n, (c + 1) * n));
    S.ids = H.id_groups.map((_, g) => A.ids.subarray(g * n, (g + 1) * n));
    S.low = S.texts.map((t) => t.toLowerCase());
    S.idStr = new Array(n);
    S.idKey = new Float64Array(n);
    for (let i = 0; i < n; i++) {  // every distinct id of the row (one per tokenizer), the first one sorts
      let s = "", key = -1, prev = -1;
      for (const ids of S.ids) {
        const v = ids[i];
        if (v < 0 || v === prev || (S.ids.length > 2 && (" " + s + " ").includes(" " + v + " "))) continue;
        s = s ? s + " " + v : String(v); if (key < 0) key = v; prev = v;
      }
      S.idStr[i] = s; S.idKey[i] = key;
    }
    S.nShared = 0;
    for (let i = 0; i < n; i++) { let all = 1; for (let c = 0; c < C; c++) if (!S.ranks[c][i]) { all = 0; break; } S.nShared += all; }
    document.title = H.title;
    $("summary").textContent = `${fmtInt.format(n)} tokens × ${C} column${C > 1 ? "s" : ""} · joined on ${H.join === "text" ? "decoded text" : "token id"} · ${fmtInt.format(n - S.nShared)} not in every column`;
    S.hasIds = S.ids.some((ids) => ids.some((v) => v >= 0));
    fitToken();
    controls(); legend(); histograms(); buildHead(); reps();
    update({ search: true });
    if (C > 1) renderShift(); else $("shift").style.display = "none";
    $("loading").classList.add("done");
    window.rmx.loadMs = performance.now();
    window.rmx.ready = true;
  }
  window.rmx = {
    ready: false, state: S, update, visible, fmtScore,
    search(q) { $("q").value = q; return update({ search: true, top: true }); },
    sortBy,
    rows: () => Array.from(S.view.subarray(0, S.nView)),
    shownTexts: () => Array.from($("rows").children).filter((r) => r.style.display !== "none")
      .sort((x, y) => parseFloat(x.style.top) - parseFloat(y.style.top)).map((r) => S.texts[+r.dataset.i]),
    shiftDelta: () => Array.from(S.shift.delta, (d, i) => (S.shift.has[i] ? d : null)),
  };
  start().catch((e) => { $("loading").textContent = "Could not read the embedded data: " + e.message; window.rmx.error = String(e); });
})();
