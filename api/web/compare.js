// compare.js — /compare?ids=1,2,3[&baseline=2]: what GET /v1/compare returns, side by side, and
// the jobs' curves overlaid (loss, eval accuracy, samples/s, peak memory). While one of them
// runs, the table and the new steps are re-read every REFRESH_MS.
import { h, clear, getJSON, banner, fmtBytes, fmtNum, fmtPct, fmtDur, stateBadge, FINAL, Steps, loadSteps,
         throttle, setLive } from "./util.js";
import { LineChart, COLORS } from "./charts.js";

const REFRESH_MS = 5000;

const ROWS = [
  ["state", null], ["model", null], ["dataset", null], ["device", null], ["amp", null],
  ["batch_size", null], ["accum_steps", null], ["effective_batch", null], ["steps", fmtNum],
  ["skipped_steps", fmtNum], ["samples_per_s", (v) => fmtNum(v, 4)], ["step_ms_median", (v) => fmtNum(v, 3) + " ms"],
  ["peak_memory_bytes", fmtBytes], ["reserved_bytes", fmtBytes], ["device_peak_used_bytes", fmtBytes],
  ["final_loss", (v) => fmtNum(v, 4)], ["val_loss", (v) => fmtNum(v, 4)], ["val_accuracy", fmtPct], ["wall_s", fmtDur],
];

function ratio(v) { return v == null ? "" : ` (×${v.toFixed(v >= 10 ? 1 : 3)})`; }
function points(v) { return v == null ? "" : ` (${v >= 0 ? "+" : ""}${v.toFixed(2)} pts)`; }

function picker(main) {
  const input = h("input", { type: "text", placeholder: "job ids, e.g. 12,13,14", size: 30, "aria-label": "job ids" });
  const go = () => {
    const ids = input.value.split(/[\s,]+/).filter(Boolean).join(",");
    if (ids) location.href = "/compare?ids=" + encodeURIComponent(ids);
  };
  input.addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
  clear(main, h("h1", {}, "Compare jobs"),
    h("p", {}, "Pick jobs on the ", h("a", { href: "/" }, "queue page"), " (Recent jobs, Compare selected), or give their ids:"),
    h("p", {}, input, " ", h("button", { onclick: go }, "Compare")));
}

export async function comparePage(main, params) {
  document.title = "trainq · compare";
  const idsParam = params.get("ids");
  if (!idsParam) { picker(main); return; }
  const baseline = params.get("baseline");
  const q = "ids=" + encodeURIComponent(idsParam) + (baseline ? "&baseline=" + encodeURIComponent(baseline) : "");

  const table = h("div", { class: "panel scroll" });
  const charts = {
    loss: new LineChart("Train loss", { fmt: (v) => fmtNum(v, 3) }),
    acc: new LineChart("Evaluation accuracy", { fmt: fmtPct, min: 0, max: 1 }),
    sps: new LineChart("Samples/s", { fmt: (v) => fmtNum(v, 3), zero: true }),
    mem: new LineChart("Peak memory per step", { fmt: fmtBytes, zero: true, bytes: true }),
  };
  clear(main, h("h1", {}, "Compare jobs"), table, h("h2", {}, "Curves"),
    h("div", { class: "charts" }, Object.values(charts).map((c) => c.el)));

  let data = null;
  const steps = new Map(), evals = new Map();

  function renderTable() {
    const jobs = data.jobs;
    const head = h("tr", {}, h("th", {}, ""), jobs.map((j, i) => h("th", {},
      h("span", { class: "swatch", "data-i": i % COLORS.length }), h("a", { href: `/jobs/${j.id}` }, j.name || `job ${j.id}`),
      h("span", { class: "muted" }, ` #${j.id}`), j.id === data.baseline ? h("span", { class: "badge" }, "baseline") :
        h("a", { class: "small", href: `/compare?ids=${encodeURIComponent(idsParam)}&baseline=${j.id}` }, "make baseline"))));
    const rows = ROWS.map(([k, f]) => h("tr", {}, h("th", {}, k), jobs.map((j) => {
      const v = j[k];
      let text = k === "state" ? stateBadge(v) : v == null ? "–" : f ? f(v) : String(v);
      const vb = j.vs_baseline || {};
      if (k === "samples_per_s" || k === "peak_memory_bytes") text = [text, h("span", { class: "muted" }, ratio(vb[k]))];
      if (k === "val_accuracy") text = [text, h("span", { class: "muted" }, points(vb.val_accuracy_points))];
      return h("td", { class: "num" }, text);
    })));
    clear(table, h("table", { class: "grid compare" }, h("thead", {}, head), h("tbody", {}, rows)));
  }

  function drawCharts() {
    if (!data) return;
    const ser = (f) => data.jobs.map((j, i) => ({ label: `${j.name || "job"} #${j.id}`, color: COLORS[i % COLORS.length], ...f(j) }));
    const col = (name) => (j) => { const s = steps.get(j.id); return { xs: s ? s.cols.step : [], ys: s ? s.cols[name] : [] }; };
    charts.loss.update(ser(col("loss")));
    charts.sps.update(ser(col("samples_per_s")));
    charts.mem.update(ser(col("mem_peak_bytes")));
    charts.acc.update(ser((j) => {
      const ev = (evals.get(j.id) || []).filter((e) => e.kind === "eval");
      return { xs: ev.map((e) => e.step), ys: ev.map((e) => e.accuracy), points: ev.length < 2 };
    }));
  }
  const redraw = throttle(drawCharts, 500);

  async function load() {
    data = await getJSON("/v1/compare?" + q);
    renderTable();
    await Promise.all(data.jobs.map(async (j) => {
      if (!steps.has(j.id)) steps.set(j.id, new Steps());
      await loadSteps(j.id, steps.get(j.id), redraw);
      evals.set(j.id, (await getJSON(`/v1/jobs/${j.id}/evals`)).evals || []);
    }));
    drawCharts();
    return data.jobs.some((j) => !FINAL.has(j.state));
  }

  let live = false;
  try { live = await load(); }
  catch (e) { clear(table, h("div", { class: "error-box" }, e.message)); return; }
  setLive(live, live ? "live" : "");
  const tick = async () => {
    if (!document.hidden) {
      try { live = await load(); } catch (e) { banner(e.message); }
      setLive(live, live ? "live" : "");
    }
    if (live) setTimeout(tick, REFRESH_MS);
  };
  if (live) setTimeout(tick, REFRESH_MS);
}
