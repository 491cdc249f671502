// util.js — DOM building (text only: nothing from the API is ever parsed as HTML), number and
// time formats, the API calls, the step loader and the downsampler the charts share.

export function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "width%") el.style.width = Math.max(0, Math.min(100, v)) + "%";   // CSSOM: CSP-safe
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid == null || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

export function clear(el, ...kids) {
  el.replaceChildren(...kids.flat(Infinity).filter((k) => k != null && k !== false));
  return el;
}

export const FINAL = new Set(["succeeded", "failed", "cancelled"]);

// ---- formats
export function fmtBytes(b) {
  if (b == null || !isFinite(b)) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = Math.abs(b);
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return (b < 0 ? "-" : "") + (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)) + " " + u[i];
}

export function fmtNum(x, digits = 3) {
  if (x == null || !isFinite(x)) return "–";
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(2);
  if (Number.isInteger(x)) return x.toLocaleString("en-US");
  return x.toLocaleString("en-US", { maximumSignificantDigits: Math.max(digits, 1) + 1 });
}

export function fmtPct(x) {
  return x == null || !isFinite(x) ? "–" : (100 * x).toFixed(2) + "%";
}

export function fmtDur(s) {
  if (s == null || !isFinite(s)) return "–";
  if (s < 1) return (s * 1000).toFixed(0) + " ms";
  if (s < 90) return s.toFixed(1) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

export function fmtAgo(rfc) {
  if (!rfc) return "–";
  const t = Date.parse(rfc);
  if (!isFinite(t)) return rfc;
  const s = (Date.now() - t) / 1000;
  return s < 0 ? "just now" : fmtDur(s) + " ago";
}

export function stateBadge(state, extra) {
  return h("span", { class: "badge st-" + state, title: extra || null }, state);
}

// ---- the API
export class ApiError extends Error {
  constructor(status, body) {
    const e = body && body.error;
    super(e ? `${e.message} (${e.code}, HTTP ${status})` : `HTTP ${status}`);
    this.status = status;
    this.code = e && e.code;
  }
}

async function answer(r) {
  if (r.status === 204) return null;
  const ct = r.headers.get("content-type") || "";
  const body = ct.includes("json") ? await r.json().catch(() => null) : await r.text();
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

export async function getJSON(path, opts) {
  return answer(await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store", ...opts }));
}

// Writes go as JSON: a cross-site form cannot send application/json, and the daemon checks it.
export async function send(method, path, body) {
  return answer(await fetch(path, {
    method, cache: "no-store",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: method === "DELETE" ? undefined : JSON.stringify(body || {}),
  }));
}

export function banner(msg, kind = "error") {
  const b = document.getElementById("banner");
  if (!b) return;
  if (!msg) { b.hidden = true; return; }
  clear(b, h("span", {}, msg), h("button", { class: "link", onclick: () => { b.hidden = true; } }, "dismiss"));
  b.className = "banner " + kind;
  b.hidden = false;
}

// ---- step records, column-wise (a job of 100,000 steps is 13 arrays of 100,000 numbers)
export const STEP_COLS = ["step", "epoch", "loss", "lr", "loss_scale", "skipped", "step_ms", "samples_per_s",
  "mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes", "device_used_bytes", "time"];

export class Steps {
  constructor() { this.cols = {}; for (const c of STEP_COLS) this.cols[c] = []; this.n = 0; }
  get last() { return this.n ? this.cols.step[this.n - 1] : 0; }
  push(rec) {   // a step record (JSON, from an event); ignores one we have
    if (rec.step <= this.last) return false;
    for (const c of STEP_COLS) {
      const v = rec[c];
      this.cols[c].push(v == null ? NaN : typeof v === "boolean" ? +v : v);
    }
    this.n++;
    return true;
  }
  pushCSV(text) {   // ?format=csv: a header row, then one row per step; returns the rows read
    const lines = text.split("\n");
    const head = (lines[0] || "").trim().split(",");
    const idx = STEP_COLS.map((c) => head.indexOf(c));
    let n = 0;
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i];
      if (!line) continue;
      const cells = line.split(",");
      const step = Number(cells[idx[0]]);
      n++;
      if (!(step > this.last)) continue;
      for (let k = 0; k < STEP_COLS.length; k++) {
        const cell = idx[k] >= 0 ? cells[idx[k]] : "";
        this.cols[STEP_COLS[k]].push(cell === "" || cell == null ? NaN : Number(cell));
      }
      this.n++;
    }
    return n;
  }
}

// Every step of a job, in pages of ?after=&limit= (CSV: a third of the JSON's bytes);
// onPage(steps) after each page, so a long job's charts fill in as it loads.
export async function loadSteps(id, steps, onPage, pageSize = 20000) {
  for (;;) {
    const r = await fetch(`/v1/jobs/${id}/steps?format=csv&after=${steps.last}&limit=${pageSize}`, { cache: "no-store" });
    if (!r.ok) throw new ApiError(r.status, await r.json().catch(() => null));
    const got = steps.pushCSV(await r.text());
    if (onPage) onPage(steps);
    if (got < pageSize) return steps;
  }
}

// ---- downsampling for the charts: min and max of each of `buckets` equal ranges of x, in x
// order. Every spike survives (a loss spike, an fp16 overflow's loss-scale drop), the cost is
// one pass, and a chart never gets more than 2 points per pixel column whatever the job's length.
export function minmax(xs, ys, buckets) {
  const n = xs.length, out = [];
  if (n === 0) return out;
  if (n <= 2 * buckets) {
    for (let i = 0; i < n; i++) if (isFinite(ys[i])) out.push({ x: xs[i], y: ys[i] });
    return out;
  }
  const x0 = xs[0], span = xs[n - 1] - x0 || 1;
  let i = 0;
  for (let b = 0; b < buckets && i < n; b++) {
    const end = x0 + (span * (b + 1)) / buckets;
    let lo = -1, hi = -1;
    for (; i < n && (xs[i] <= end || b === buckets - 1); i++) {
      const y = ys[i];
      if (!isFinite(y)) continue;
      if (lo < 0 || y < ys[lo]) lo = i;
      if (hi < 0 || y > ys[hi]) hi = i;
    }
    if (lo < 0) continue;
    if (lo === hi) out.push({ x: xs[lo], y: ys[lo] });
    else if (lo < hi) out.push({ x: xs[lo], y: ys[lo] }, { x: xs[hi], y: ys[hi] });
    else out.push({ x: xs[hi], y: ys[hi] }, { x: xs[lo], y: ys[lo] });
  }
  return out;
}

// run fn at most once per `ms`, the last call winning
export function throttle(fn, ms) {
  let timer = null, pending = false;
  return function run() {
    if (timer) { pending = true; return; }
    fn();
    timer = setTimeout(() => { timer = null; if (pending) { pending = false; run(); } }, ms);
  };
}

export function setLive(on, text) {
  const el = document.getElementById("live");
  if (!el) return;
  el.className = "live" + (on ? " on" : "");
  el.textContent = text || (on ? "live" : "");
}
