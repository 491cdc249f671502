// charts.js — one line chart over steps, on Debian's Chart.js (window.Chart, loaded by
// index.html before the modules). Series are downsampled here (util.js minmax) to about two
// points per pixel column, so a job of 100,000 steps draws as fast as one of 100.
import { h, minmax } from "./util.js";

export const COLORS = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7ea4", "#57606a"];

export class LineChart {
  // opts: { y: "log"|undefined, fmt: y -> text, xTitle, zero (from 0), min, max,
  //         bytes (ticks at a power of two bytes: 0, 4, 8, 12 MiB, not 4.77, 9.54 MiB) }
  constructor(title, opts = {}) {
    this.opts = opts;
    this.canvas = h("canvas", { role: "img", "aria-label": title });
    this.empty = h("div", { class: "chart-empty" }, "no data yet");
    this.box = h("div", { class: "chart-box" }, this.canvas, this.empty);
    this.el = h("section", { class: "chart" }, h("h3", {}, title), this.box);
    this.chart = null;
    if (!window.Chart) {
      this.empty.textContent = window.TQ_NO_CHARTS || "charts unavailable: Chart.js did not load";
    }
  }

  // series: [{ label, xs, ys, color, points (markers, no line), dashed, hline (a constant y) }]
  update(series) {
    if (!window.Chart) return;
    const width = Math.max(200, this.box.clientWidth || 600);
    let xmin = Infinity, xmax = -Infinity;
    for (const s of series) {
      if (s.hline != null || !s.xs || !s.xs.length) continue;
      xmin = Math.min(xmin, s.xs[0]); xmax = Math.max(xmax, s.xs[s.xs.length - 1]);
    }
    const datasets = [];
    let any = false;
    series.forEach((s, i) => {
      const color = s.color || COLORS[i % COLORS.length];
      let data;
      if (s.hline != null) {
        if (!isFinite(xmin) || !isFinite(s.hline)) return;
        data = [{ x: xmin, y: s.hline }, { x: xmax, y: s.hline }];
      } else {
        data = s.points ? pointsOf(s.xs, s.ys) : minmax(s.xs, s.ys, width);
        if (this.opts.y === "log") data = data.filter((p) => p.y > 0);
        if (data.length) any = true;
      }
      datasets.push({
        label: s.label, data, borderColor: color, backgroundColor: color,
        borderWidth: s.hline != null ? 1.5 : 1.5, borderDash: s.dashed || s.hline != null ? [6, 4] : undefined,
        pointRadius: s.points ? 3.5 : 0, pointHoverRadius: s.points ? 5 : 3,
        showLine: !s.points, spanGaps: false, tension: 0,
        // unclipped: markers, and lines on a fixed scale (an accuracy of 100% on its top edge)
        clip: s.points || this.opts.max != null ? false : undefined,
      });
    });
    this.empty.hidden = any;
    // a flat series (a constant lr): Chart.js would pad it by ±1 whatever its size; ±10% instead
    let ylo = Infinity, yhi = -Infinity;
    for (const d of datasets) for (const p of d.data) { if (p.y < ylo) ylo = p.y; if (p.y > yhi) yhi = p.y; }
    const flat = isFinite(ylo) && yhi - ylo <= 1e-9 * Math.abs(yhi) && yhi !== 0 && this.opts.y !== "log";
    const pad = flat ? { suggestedMin: this.opts.zero ? 0 : ylo - 0.1 * Math.abs(ylo), suggestedMax: yhi + 0.1 * Math.abs(yhi) }
                     : { suggestedMin: undefined, suggestedMax: undefined };
    // bytes: the power of two that splits the range into 3..5 steps (at most 6 ticks)
    let step;
    if (this.opts.bytes && isFinite(yhi) && yhi > 0) {
      const top = flat ? pad.suggestedMax : yhi, range = top - (this.opts.zero ? 0 : Math.min(ylo, top));
      step = Math.pow(2, Math.ceil(Math.log2(Math.max(range, 1) / 5)));
    }
    if (!this.chart) {
      if (!any) return;
      const cfg = this.config(datasets);
      Object.assign(cfg.options.scales.y, pad);
      cfg.options.scales.y.ticks.stepSize = step;
      this.chart = new window.Chart(this.canvas.getContext("2d"), cfg);
    } else {
      Object.assign(this.chart.options.scales.y, pad);
      this.chart.options.scales.y.ticks.stepSize = step;
      this.chart.data.datasets = datasets;
      this.chart.options.plugins.legend.display = datasets.length > 1;
      this.chart.update("none");
    }
  }

  config(datasets) {
    const fmt = this.opts.fmt || ((v) => String(v));
    return {
      type: "line",
      data: { datasets },
      options: {
        animation: false, parsing: false, normalized: true, responsive: true, maintainAspectRatio: false,
        interaction: { mode: "nearest", axis: "x", intersect: false },
        scales: {
          x: { type: "linear", title: { display: true, text: this.opts.xTitle || "step" },
               ticks: { maxTicksLimit: 8 } },
          y: { type: this.opts.y === "log" ? "logarithmic" : "linear",
               min: this.opts.min, max: this.opts.max, beginAtZero: !!this.opts.zero,
               ticks: { maxTicksLimit: 6, callback: (v) => fmt(v) } },
        },
        plugins: {
          legend: { display: datasets.length > 1, labels: { boxWidth: 12, boxHeight: 2 } },
          tooltip: {
            callbacks: {
              title: (items) => (items.length ? `${this.opts.xTitle || "step"} ${items[0].parsed.x}` : ""),
              label: (it) => `${it.dataset.label}: ${fmt(it.parsed.y)}`,
            },
          },
        },
      },
    };
  }

  destroy() { if (this.chart) { this.chart.destroy(); this.chart = null; } }
}

function pointsOf(xs, ys) {
  const out = [];
  for (let i = 0; i < xs.length; i++) if (isFinite(ys[i])) out.push({ x: xs[i], y: ys[i] });
  return out;
}
