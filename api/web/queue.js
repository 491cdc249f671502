// queue.js — /: the devices with the jobs running on each (progress, planned against measured
// memory, samples/s), the queue in order with why each job waits, and the recent finished jobs.
// Live: the event stream of each running job (up to MAX_STREAMS: a browser keeps at most 6
// connections to one host) moves its progress; a state event, or every REFRESH_MS, re-reads
// /v1/jobs and /v1/devices. Nothing is read while the tab is hidden.
import { h, clear, getJSON, send, banner, fmtBytes, fmtNum, fmtPct, fmtDur, fmtAgo, stateBadge, FINAL,
         throttle, setLive } from "./util.js";

const REFRESH_MS = 5000;
const MAX_STREAMS = 4;

// brief: the queue table's cell, where a busy device's words (on its card above, and in the
// cell's title) would push the table wider than the page
export function waitingText(j, brief = false) {
  const w = j.waiting_for;
  if (!w) return "";
  switch (w.reason) {
    case "memory": return `memory on ${w.device}: needs ${fmtBytes(w.needs_bytes)}, ${fmtBytes(w.free_bytes)} free`;
    case "max_jobs": return `${w.device} runs its maximum of jobs`;
    case "priority": return `${w.device} is held for job #${w.behind}`;
    case "storage": return `the database: ${w.message || "cannot be written"}`;
    case "dependency": return `job${(w.after || []).length > 1 ? "s" : ""} ${(w.after || []).map(i => "#" + i).join(", ")} to succeed (after)`;
    case "user_limit": return "its owner runs their maximum of jobs";
    case "device_busy": return brief ? `${w.device} is busy (why: on its card)` : `${w.device} is busy${w.message ? ": " + w.message : ""}`;
    default: return w.reason + (w.device ? ` (${w.device})` : "") + (w.message ? `: ${w.message}` : "");
  }
}

// Cancel (queued, running), Requeue (failed, cancelled) or Delete (finished): JSON requests; Cancel and
// Delete are confirmed first.
export function jobActions(j, after, afterDelete) {
  const box = h("span", { class: "actions" });
  if (!FINAL.has(j.state) && !j.cancel_requested) {
    box.append(h("button", { class: "danger", title: "POST /v1/jobs/" + j.id + "/cancel", onclick: async (e) => {
      if (!confirm(`Cancel job ${j.id} (${j.name})?`)) return;
      e.target.disabled = true;
      try { await send("POST", `/v1/jobs/${j.id}/cancel`, {}); banner(`job ${j.id}: cancel sent`, "info"); }
      catch (err) { banner(err.message); }
      after && after();
    } }, "Cancel"));
  }
  if (j.state === "failed" || j.state === "cancelled") {
    box.append(h("button", { title: "POST /v1/jobs/" + j.id + "/requeue: back to the queue, resuming from its checkpoint",
                             onclick: async (e) => {
      e.target.disabled = true;
      try { await send("POST", `/v1/jobs/${j.id}/requeue`, {}); banner(`job ${j.id} requeued`, "info"); }
      catch (err) { banner(err.message); }
      after && after();
    } }, "Requeue"));
  }
  if (FINAL.has(j.state)) {
    box.append(h("button", { class: "danger", title: "DELETE /v1/jobs/" + j.id, onclick: async (e) => {
      if (!confirm(`Delete job ${j.id} (${j.name}) with its records, model and checkpoint?`)) return;
      e.target.disabled = true;
      try { await send("DELETE", `/v1/jobs/${j.id}`); banner(`job ${j.id} deleted`, "info"); (afterDelete || after)(); }
      catch (err) { banner(err.message); after && after(); }
    } }, "Delete"));
  }
  return box;
}

function jobLink(j) {
  return h("a", { href: `/jobs/${j.id}` }, j.name || `job ${j.id}`);
}

// a bar of used/whole (0..1), with the measured share as a second colour
function memBar(planned, measured, label) {
  const over = planned && measured > planned;
  return h("div", { class: "membar" + (over ? " over" : ""), title: label },
    h("div", { class: "fill", "width%": planned ? (100 * measured) / planned : 0 }));
}

export async function queuePage(main) {
  document.title = "trainq · queue";
  const devBox = h("div", { class: "devices" });
  const cudaNote = h("p", { class: "muted note-small" });
  const queuedBox = h("div", { class: "panel" });
  const doneBox = h("div", { class: "panel" });
  const selected = new Set();
  clear(main, h("h2", {}, "Devices and running jobs"), devBox, cudaNote, h("h2", {}, "Queue"), queuedBox,
    h("h2", {}, "Recent jobs"), doneBox);

  let running = [], queued = [], recent = [], devices = null;
  const streams = new Map();   // job id -> EventSource

  function renderDevices() {
    if (!devices) return;
    const byId = new Map(running.map((j) => [j.id, j]));
    const placed = new Set();
    const cards = (devices.devices || []).map((d) => {
      const jobs = (d.jobs || []).map((dj) => {
        placed.add(dj.id);
        return runningRow(byId.get(dj.id), dj);
      });
      const title = d.id + (d.name ? ` · ${d.name}` : "") + (d.arch ? ` (${d.arch})` : "") + (d.threads ? ` · ${d.threads} threads` : "");
      return h("section", { class: "device" },
        h("h3", {}, title),
        h("div", { class: "devstat" },
          h("div", { class: "membar", title: "planned / budget" },
            h("div", { class: "fill planned", "width%": d.budget_bytes ? (100 * d.planned_bytes) / d.budget_bytes : 0 })),
          h("span", {}, `planned ${fmtBytes(d.planned_bytes)} of ${fmtBytes(d.budget_bytes)} budget · ` +
            `${fmtBytes(d.free_planned_bytes)} free · ${d.running_jobs}/${d.max_jobs} jobs` +
            (d.driver_used_bytes != null ? ` · driver: ${fmtBytes(d.driver_used_bytes)} used of ${fmtBytes(d.memory_total_bytes)}` : ""))),
        d.busy ? h("p", { class: "note" }, "busy: " + d.busy) : null,
        jobs.length ? h("div", { class: "runlist" }, jobs) : h("p", { class: "muted" }, "idle"));
    });
    const orphans = running.filter((j) => !placed.has(j.id)).map((j) => runningRow(j, null));
    clear(devBox, cards, orphans.length ? h("section", { class: "device" }, h("h3", {}, "running (not yet placed)"), orphans) : null);
    clear(cudaNote, devices.cuda && devices.cuda !== "available" ? "CUDA: " + devices.cuda : "");
  }

  function runningRow(j, dj) {
    if (!j) return h("div", { class: "run" }, h("a", { href: `/jobs/${dj.id}` }, `job ${dj.id}`), " (starting)");
    const p = j.progress || {}, l = j.latest || {};
    const total = p.total_steps || 0;
    const planned = (dj && dj.planned_bytes) || j.planned_peak_bytes;
    const reserved = (dj && dj.mem_reserved_bytes) ?? l.mem_reserved_bytes;
    const sps = (dj && dj.samples_per_s) ?? l.samples_per_s;
    const eta = total && l.step_ms ? ((total - (p.step || 0)) * l.step_ms) / 1000 : null;
    return h("div", { class: "run" },
      h("div", { class: "run-top" }, jobLink(j), h("span", { class: "muted" }, ` #${j.id}`),
        j.cancel_requested ? h("span", { class: "badge st-cancelled" }, "cancelling") : null,
        h("span", { class: "grow" }), jobActions(j, refresh)),
      h("div", { class: "run-prog" }, h("progress", { max: total || 1, value: Math.min(p.step || 0, total || 1) }),
        h("span", {}, `${fmtNum(p.step || 0)} / ${total ? fmtNum(total) : "?"} steps` + (total ? ` (${fmtPct((p.step || 0) / total)})` : "") +
          ` · epoch ${p.epoch ?? "–"}` + (eta != null ? ` · ~${fmtDur(eta)} left` : ""))),
      h("div", { class: "run-mem" }, memBar(planned, l.mem_peak_bytes || 0, "measured peak / planned"),
        h("span", {}, `peak ${fmtBytes(l.mem_peak_bytes)} · reserved ${fmtBytes(reserved)} · planned ${fmtBytes(planned)}` +
          ` · ${fmtNum(sps, 3)} samples/s` + (l.loss != null ? ` · loss ${fmtNum(l.loss, 4)}` : ""))));
  }

  function renderQueued() {
    if (!queued.length) { clear(queuedBox, h("p", { class: "muted" }, "no job waits")); return; }
    const rows = [...queued].sort((a, b) => (a.queue_position ?? 1e9) - (b.queue_position ?? 1e9)).map((j) =>
      h("tr", {}, h("td", { class: "num" }, j.queue_position ?? "–"), h("td", {}, jobLink(j), h("span", { class: "muted" }, ` #${j.id}`)),
        h("td", {}, j.owner ?? "–"), h("td", { class: "num" }, j.priority ?? 0), h("td", {}, j.spec?.device ?? "auto"),
        h("td", { class: "num" }, fmtBytes(j.planned_peak_bytes)), h("td", { title: waitingText(j) || null }, waitingText(j, true) || "–"),
        h("td", {}, fmtAgo(j.created_at)), h("td", {}, jobActions(j, refresh))));
    clear(queuedBox, h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, ["#", "job", "owner", "priority", "device", "planned peak", "waiting for", "submitted", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)));
  }

  function renderRecent() {
    if (!recent.length) { clear(doneBox, h("p", { class: "muted" }, "no finished job yet")); return; }
    const cmp = h("a", { class: "button", href: "#" }, "Compare selected");
    const syncCmp = () => {
      cmp.href = "/compare?ids=" + [...selected].join(",");
      cmp.classList.toggle("disabled", selected.size < 1);
      cmp.textContent = `Compare selected (${selected.size})`;
    };
    const rows = recent.map((j) => {
      const s = j.summary || {};
      const box = h("input", { type: "checkbox", "aria-label": `select job ${j.id}`, checked: selected.has(j.id),
        onchange: (e) => { e.target.checked ? selected.add(j.id) : selected.delete(j.id); syncCmp(); } });
      return h("tr", {}, h("td", {}, box), h("td", {}, jobLink(j), h("span", { class: "muted" }, ` #${j.id}`)),
        h("td", {}, stateBadge(j.state, j.error ? j.error.message : null), j.error ? h("span", { class: "muted" }, " " + j.error.code) : null),
        h("td", {}, j.spec ? `${j.spec.model}/${j.spec.dataset}` : "–"),
        h("td", { class: "num" }, fmtNum(s.steps ?? j.progress?.step)), h("td", { class: "num" }, fmtNum(s.final_loss, 4)),
        h("td", { class: "num" }, fmtPct(s.val_accuracy)), h("td", { class: "num" }, fmtNum(s.samples_per_s, 3)),
        h("td", { class: "num" }, fmtDur(s.wall_s)), h("td", {}, fmtAgo(j.finished_at)), h("td", {}, jobActions(j, refresh)));
    });
    syncCmp();
    clear(doneBox, h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, ["", "job", "outcome", "model/data", "steps", "final loss", "val acc", "samples/s", "wall", "finished", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)), h("p", {}, cmp));
  }

  const renderRunning = throttle(renderDevices, 250);

  function syncStreams() {
    const want = new Set(running.slice(0, MAX_STREAMS).map((j) => j.id));
    for (const [id, es] of streams) if (!want.has(id)) { es.close(); streams.delete(id); }
    for (const j of running) {
      if (!want.has(j.id) || streams.has(j.id)) continue;
      const es = new EventSource(`/v1/jobs/${j.id}/events?after=${(j.latest && j.latest.step) || 0}`);
      es.addEventListener("step", (e) => {
        const rec = JSON.parse(e.data), cur = running.find((r) => r.id === j.id);
        if (!cur) return;
        cur.latest = rec;
        cur.progress = { ...(cur.progress || {}), step: rec.step, epoch: rec.epoch };
        renderRunning();
      });
      es.addEventListener("state", () => refreshSoon());
      es.addEventListener("job", () => { es.close(); streams.delete(j.id); refreshSoon(); });
      streams.set(j.id, es);
    }
    setLive(streams.size > 0 || !document.hidden, streams.size ? `live · ${streams.size} stream${streams.size > 1 ? "s" : ""}` : "live");
  }

  let timer = null, inflight = false;
  async function refresh() {
    clearTimeout(timer);
    if (document.hidden) { timer = null; return; }   // visibilitychange resumes
    if (inflight) return;
    inflight = true;
    try {
      const [r, q, all, d] = await Promise.all([getJSON("/v1/jobs?state=running&limit=1000"),
        getJSON("/v1/jobs?state=queued&limit=1000"), getJSON("/v1/jobs?limit=100"), getJSON("/v1/devices")]);
      running = r.jobs; queued = q.jobs; devices = d;
      recent = all.jobs.filter((j) => FINAL.has(j.state)).slice(0, 25);
      const known = new Set(recent.map((j) => j.id));
      for (const id of selected) if (!known.has(id)) selected.delete(id);
      renderDevices(); renderQueued(); renderRecent(); syncStreams();
      banner(null);
    } catch (e) {
      banner("cannot read the daemon: " + e.message);
      setLive(false, "offline");
    } finally {
      inflight = false;
      timer = setTimeout(refresh, REFRESH_MS);
    }
  }
  let soon = null;
  function refreshSoon() { if (!soon) soon = setTimeout(() => { soon = null; refresh(); }, 300); }

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      for (const es of streams.values()) es.close();
      streams.clear();
      setLive(false, "paused");
    } else refresh();
  });
  addEventListener("pagehide", () => { for (const es of streams.values()) es.close(); });
  await refresh();
}
