// job.js — /jobs/{id}: the job's state, spec and summary, its per-step curves (loss, lr, loss
// scale, samples/s, memory against the plan) and evals, live from its event stream while it runs.
import { h, clear, getJSON, send, banner, fmtBytes, fmtNum, fmtPct, fmtDur, fmtAgo, stateBadge, FINAL,
         Steps, loadSteps, throttle, setLive } from "./util.js";
import { LineChart, COLORS } from "./charts.js";
import { waitingText, jobActions } from "./queue.js";

export function fmtField(key, v) {
  if (v == null) return "–";
  if (typeof v === "object") return JSON.stringify(v);
  if (typeof v !== "number") return String(v);
  if (key.endsWith("_bytes")) return fmtBytes(v);
  if (key.endsWith("accuracy")) return fmtPct(v);
  if (key === "wall_s") return fmtDur(v);
  if (key.endsWith("_ms") || key.endsWith("_ms_median")) return fmtNum(v) + " ms";
  return fmtNum(v, 4);
}

export async function jobPage(main, id) {
  document.title = `trainq · job ${id}`;
  const steps = new Steps();
  const evals = new Map();   // kind/step -> eval record
  let job = null, es = null;

  const head = h("div", { class: "job-head" });
  const info = h("div", { class: "panel" });
  const summary = h("div", { class: "panel" });
  const spec = h("details", { class: "panel spec" });
  const charts = {
    loss: new LineChart("Loss", { fmt: (v) => fmtNum(v, 3) }),
    acc: new LineChart("Evaluation accuracy", { fmt: fmtPct, min: 0, max: 1 }),
    lr: new LineChart("Learning rate", { fmt: (v) => fmtNum(v, 3) }),
    sps: new LineChart("Samples/s", { fmt: (v) => fmtNum(v, 3), zero: true }),
    mem: new LineChart("Memory", { fmt: fmtBytes, zero: true, bytes: true }),
    scale: new LineChart("fp16 loss scale", { y: "log", fmt: (v) => fmtNum(v, 3) }),
  };
  const grid = h("div", { class: "charts" }, Object.values(charts).map((c) => c.el));
  const noSteps = h("p", { class: "muted", hidden: true }, "No step was recorded: the job ended before its first step.");
  const links = h("div", { class: "links" });
  clear(main, head, info, links, summary, h("h2", {}, "Curves"), noSteps, grid, spec);

  function renderHead() {
    const j = job;
    document.title = `trainq · ${j.name || "job " + j.id}`;
    clear(head,
      h("h1", {}, h("span", { class: "job-name" }, j.name || "(no name)"), " ", h("span", { class: "muted" }, "#" + j.id), " ",
        stateBadge(j.state, j.error ? j.error.code : null)),
      jobActions(j, refresh, () => { location.href = "/"; }));
    const p = j.progress || {};
    const total = p.total_steps || 0;
    const b = j.batch || {};
    const rows = [
      ["progress", h("span", {}, h("progress", { max: total || 1, value: Math.min(p.step || 0, total || 1) }),
        ` step ${fmtNum(p.step || 0)} of ${total ? fmtNum(total) : "?"} · epoch ${p.epoch ?? "–"}`)],
      ["model / data", `${j.spec?.model ?? "?"} on ${j.spec?.dataset ?? "?"}` + (j.spec?.amp && j.spec.amp !== "off" ? ` · amp ${j.spec.amp}` : "")],
      ["batch", `${b.batch_size ?? "?"} × ${b.accum_steps ?? 1} = ${b.effective_batch ?? "?"}` + (b.auto ? " (auto)" : "")],
      ["device", (j.device || (j.spec && j.spec.device) || "–") + (j.threads ? ` · ${j.threads} thread${j.threads > 1 ? "s" : ""}` : "")],
      ["planned peak", fmtBytes(j.planned_peak_bytes)],
      ["owner", j.owner ?? "–"],
      ["submitted", fmtAgo(j.created_at)],
      ["started", j.started_at ? fmtAgo(j.started_at) : "–"],
      ["finished", j.finished_at ? fmtAgo(j.finished_at) : "–"],
      ["attempts", `${j.attempts ?? 0} of ${j.max_attempts ?? "?"}` + (j.interruptions ? ` · ${j.interruptions} interruptions` : "")],
    ];
    if (j.state === "queued") rows.splice(1, 0, ["waiting for", waitingText(j) || `position ${j.queue_position ?? "?"} in the queue`]);
    if (j.latest) rows.push(["latest step", `loss ${fmtNum(j.latest.loss, 4)} · ${fmtNum(j.latest.samples_per_s, 3)} samples/s · ` +
                                             `${fmtNum(j.latest.step_ms, 3)} ms · peak ${fmtBytes(j.latest.mem_peak_bytes)}`]);
    clear(info, j.error ? h("div", { class: "error-box" }, h("b", {}, j.error.code + ": "), j.error.message) : null,
      j.cancel_requested && !FINAL.has(j.state) ? h("div", { class: "note" }, "cancel requested: it stops at its next step boundary") : null,
      h("dl", { class: "kv" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
    clear(links,
      j.state === "succeeded" ? h("a", { class: "button", href: `/v1/jobs/${j.id}/model`, download: `job-${j.id}.safetensors` }, "Download model") : null,
      h("a", { class: "button", href: `/v1/jobs/${j.id}/steps?format=csv`, download: `job-${j.id}-steps.csv` }, "Steps CSV"),
      h("a", { href: `/v1/jobs/${j.id}/evals` }, "evals JSON"),
      h("a", { href: `/v1/jobs/${j.id}/log` }, "log"),
      h("a", { href: `/v1/jobs/${j.id}` }, "job JSON"),
      h("a", { href: `/compare?ids=${j.id}` }, "compare…"));
    if (j.summary) {
      clear(summary, h("h2", {}, "Summary"),
        h("div", { class: "tiles" }, Object.entries(j.summary).filter(([k]) => k !== "error").map(([k, v]) =>
          h("div", { class: "tile" }, h("div", { class: "tile-k" }, k), h("div", { class: "tile-v" }, fmtField(k, v))))));
      summary.hidden = false;
    } else summary.hidden = true;
    if (!spec.firstChild) clear(spec, h("summary", {}, "Spec"), h("pre", {}, JSON.stringify(j.spec, null, 2)));
  }

  function drawCharts() {
    const none = !!job && FINAL.has(job.state) && steps.n === 0 && evals.size === 0;
    noSteps.hidden = !none;
    grid.hidden = none;
    if (none) return;
    const c = steps.cols, xs = c.step;
    const ev = [...evals.values()].sort((a, b) => a.step - b.step);
    const kind = (k) => ev.filter((e) => e.kind === k);
    const exs = (l) => l.map((e) => e.step);
    const val = kind("eval");
    charts.loss.update([
      { label: "train loss", xs, ys: c.loss },
      { label: "val loss", xs: exs(val), ys: val.map((e) => e.loss), points: true, color: COLORS[1] },
    ]);
    charts.acc.update([
      { label: "eval", xs: exs(val), ys: val.map((e) => e.accuracy), points: true },
      ...["pruned", "int8"].map((k, i) => ({ label: k, xs: exs(kind(k)), ys: kind(k).map((e) => e.accuracy), points: true, color: COLORS[i + 1] })),
    ].filter((s) => s.xs.length || s.label === "eval"));
    charts.lr.update([{ label: "lr", xs, ys: c.lr }]);
    charts.sps.update([{ label: "samples/s", xs, ys: c.samples_per_s, color: COLORS[2] }]);
    const hasDev = c.device_used_bytes.some((v) => isFinite(v));
    charts.mem.update([
      { label: "allocated", xs, ys: c.mem_allocated_bytes },
      { label: "peak", xs, ys: c.mem_peak_bytes, color: COLORS[1] },
      { label: "reserved", xs, ys: c.mem_reserved_bytes, color: COLORS[3] },
      hasDev ? { label: "device used", xs, ys: c.device_used_bytes, color: COLORS[4] } : null,
      job && job.planned_peak_bytes ? { label: "planned peak", hline: job.planned_peak_bytes, color: COLORS[7] } : null,
    ].filter(Boolean));
    const fp16 = (job && job.spec && job.spec.amp === "fp16") || c.loss_scale.some((v) => isFinite(v));
    charts.scale.el.hidden = !fp16;
    if (fp16) {
      const sk = [], sy = [];
      for (let i = 0; i < steps.n; i++) if (c.skipped[i] === 1) { sk.push(xs[i]); sy.push(c.loss_scale[i]); }
      charts.scale.update([{ label: "loss scale", xs, ys: c.loss_scale },
                           { label: "skipped step", xs: sk, ys: sy, points: true, color: COLORS[1] }]);
    }
  }
  const redraw = throttle(drawCharts, 500);
  const redrawHead = throttle(() => job && renderHead(), 500);

  async function refresh() {
    try { job = await getJSON(`/v1/jobs/${id}`); renderHead(); }
    catch (e) { banner(e.message); }
  }

  function addEvals(list) { for (const e of list) evals.set(`${e.kind}/${e.step}/${e.time}`, e); }

  function follow() {
    es = new EventSource(`/v1/jobs/${id}/events?after=${steps.last}`);
    setLive(true);
    es.addEventListener("step", (e) => {
      const rec = JSON.parse(e.data);
      if (steps.push(rec) && job) {
        job.latest = rec;
        job.progress = { ...(job.progress || {}), step: rec.step, epoch: rec.epoch };
        redrawHead();
      }
      redraw();
    });
    es.addEventListener("eval", (e) => { addEvals([JSON.parse(e.data)]); redraw(); });
    es.addEventListener("state", (e) => {
      const d = JSON.parse(e.data);
      if (d.state === "deleted") { es.close(); setLive(false, "deleted"); banner(`job ${id} was deleted`, "info"); return; }
      refresh();
    });
    es.addEventListener("job", (e) => {   // the last event: the finished job
      job = JSON.parse(e.data);
      es.close(); setLive(false, "finished");
      renderHead(); drawCharts();
    });
    es.onerror = () => { if (es.readyState === EventSource.CLOSED) setLive(false, "disconnected"); };
  }

  try {
    job = await getJSON(`/v1/jobs/${id}`);
  } catch (e) {
    clear(main, h("h1", {}, `Job ${id}`), h("div", { class: "error-box" }, e.message), h("p", {}, h("a", { href: "/" }, "back to the queue")));
    return;
  }
  renderHead();
  try {
    const [, ev] = await Promise.all([loadSteps(id, steps, redraw), getJSON(`/v1/jobs/${id}/evals`)]);
    addEvals(ev.evals || []);
  } catch (e) { banner(e.message); }
  drawCharts();
  if (!FINAL.has(job.state)) follow();
  else setLive(false);
  addEventListener("pagehide", () => es && es.close());
}
