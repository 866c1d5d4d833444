// Learning curves with uPlot: one panel per quantity (loss, accuracy, ..., lr, samples/s), train,
// validation and test in the same panel, one series per worker group when a job reports several
// groups.
// The server downsamples history to MAX_POINTS per series; live points are appended and thinned
// here so a 100,000-step job never holds more than a few thousand points per series.

import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

import type { Series } from "../api";
import { formatValue, h } from "../dom";

export const MAX_POINTS = 1500;
const KEEP_POINTS = 2 * MAX_POINTS;
const REDRAW_MS = 400;
const SPARSE_POINTS = 60;
const PHASE_COLOURS: Record<string, string> = { train: "#2563eb", val: "#16a34a", test: "#ea580c" };
const GROUP_COLOURS = ["#2563eb", "#16a34a", "#ea580c", "#9333ea", "#0891b2", "#db2777", "#ca8a04"];

interface Line {
  name: string;
  group: number;
  rank: number;
  xs: number[];
  ys: number[];
}

interface Panel {
  key: string;
  title: string;
  el: HTMLElement;
  plotHost: HTMLElement;
  latest: HTMLElement;
  lines: Line[];
  plot: uPlot | null;
  shape: string;
}

const TITLES: Record<string, string> = { lr: "Learning rate", samples_per_sec: "Samples / s" };

/**
 * A series' legend value while the cursor hovers a chart whose series report at different x
 * (train loss every few steps, validation now and then; jobs side by side): its value at the
 * hovered x, or, when it has none there, its nearest value with that value's own x beside it,
 * so that no value reads as if it were at a step it was not.
 */
export function hoverValue(where: (x: number) => string): uPlot.Series.Value {
  return (u, value, _series, idx) => {
    const hovered = u.cursor.idx;
    if (idx === null || hovered === null || hovered === undefined || idx === hovered) {
      return formatValue(value);
    }
    return `${formatValue(value)} (${where(u.data[0][idx])})`;
  };
}

/** A step as the legend says it. */
export const atStep = (step: number): string => `step ${step}`;

/** `train/loss`, `val/loss` and `test/loss` share the `loss` panel; `lr` and `samples_per_sec`
 * get their own. */
export function panelOf(name: string): { key: string; title: string; phase: string } {
  const match = /^(train|val|test)\/(.+)$/.exec(name);
  const key = match ? match[2] : name;
  const words = key.replace(/_/g, " ");
  const title = TITLES[key] ?? words.charAt(0).toUpperCase() + words.slice(1);
  return { key, title, phase: match ? match[1] : "" };
}

function panelRank(key: string): number {
  const order = ["loss", "accuracy"];
  if (order.includes(key)) return order.indexOf(key);
  if (key === "lr") return 90;
  if (key === "samples_per_sec") return 91;
  return 10;
}

/** Halves a long series, keeping its newest half intact: the recent curve stays sharp. */
function thin(line: Line): void {
  if (line.xs.length <= KEEP_POINTS) return;
  const half = Math.floor(line.xs.length / 2);
  const xs: number[] = [];
  const ys: number[] = [];
  for (let i = 0; i < line.xs.length; i++) {
    if (i >= half || i % 2 === 1) {
      xs.push(line.xs[i]);
      ys.push(line.ys[i]);
    }
  }
  line.xs = xs;
  line.ys = ys;
}

export class MetricCharts {
  private readonly panels = new Map<string, Panel>();
  private readonly dirty = new Set<Panel>();
  private readonly resize: ResizeObserver;
  private timer: number | undefined;
  private groups = new Set<number>();

  constructor(private readonly host: HTMLElement) {
    host.classList.add("charts");
    this.resize = new ResizeObserver(() => {
      for (const panel of this.panels.values()) {
        panel.plot?.setSize(this.size(panel));
      }
    });
    this.resize.observe(host);
  }

  /** Replaces everything with a fresh history from the server. */
  load(series: Series[]): void {
    for (const panel of this.panels.values()) panel.lines = [];
    this.groups = new Set(series.map((s) => s.group));
    for (const s of series) {
      const line = this.line(s.name, s.group, s.rank);
      // A diverged value (NaN, infinity) arrives as null and leaves a gap.
      const finite = s.points.filter((p): p is [number, number] => p[1] !== null);
      line.xs = finite.map((p) => p[0]);
      line.ys = finite.map((p) => p[1]);
    }
    for (const panel of this.panels.values()) this.dirty.add(panel);
    this.schedule();
  }

  /** One live metric record: several named values at a step from one worker. */
  append(step: number, group: number, rank: number, values: Record<string, number | null>): void {
    this.groups.add(group);
    for (const [name, value] of Object.entries(values)) {
      if (value === null || !Number.isFinite(value)) continue;
      const line = this.line(name, group, rank);
      if (line.xs.length > 0 && step <= line.xs[line.xs.length - 1]) continue;
      line.xs.push(step);
      line.ys.push(value);
      thin(line);
    }
    this.schedule();
  }

  get pointCount(): number {
    let count = 0;
    for (const panel of this.panels.values()) {
      for (const line of panel.lines) count += line.xs.length;
    }
    return count;
  }

  destroy(): void {
    window.clearTimeout(this.timer);
    this.resize.disconnect();
    for (const panel of this.panels.values()) panel.plot?.destroy();
    this.panels.clear();
  }

  private line(name: string, group: number, rank: number): Line {
    const { key, title } = panelOf(name);
    let panel = this.panels.get(key);
    if (!panel) {
      const plotHost = h("div", { class: "chart-plot" });
      const latest = h("span", { class: "chart-latest" });
      const el = h(
        "figure",
        { class: "chart", "data-metric": key },
        h("figcaption", {}, h("strong", {}, title), latest),
        plotHost,
      );
      panel = { key, title, el, plotHost, latest, lines: [], plot: null, shape: "" };
      this.panels.set(key, panel);
      // Loss and accuracy first, then other metrics, then lr and samples/s; moving a panel's
      // element keeps its chart.
      const order = [...this.panels.values()].sort(
        (a, b) => panelRank(a.key) - panelRank(b.key) || a.key.localeCompare(b.key),
      );
      for (const p of order) this.host.append(p.el);
    }
    this.dirty.add(panel);
    let line = panel.lines.find((l) => l.name === name && l.group === group && l.rank === rank);
    if (!line) {
      line = { name, group, rank, xs: [], ys: [] };
      panel.lines.push(line);
      panel.lines.sort((a, b) => a.group - b.group || a.rank - b.rank || a.name.localeCompare(b.name));
    }
    return line;
  }

  private schedule(): void {
    if (this.timer !== undefined) return;
    this.timer = window.setTimeout(() => {
      this.timer = undefined;
      for (const panel of this.dirty) this.draw(panel);
      this.dirty.clear();
    }, REDRAW_MS);
  }

  private size(panel: Panel): { width: number; height: number } {
    return { width: Math.max(panel.plotHost.clientWidth, 200), height: 210 };
  }

  private label(line: Line): string {
    const ranks = new Set(
      [...this.panels.values()].flatMap((p) => p.lines.filter((l) => l.group === line.group).map((l) => l.rank)),
    );
    let label = line.name;
    if (this.groups.size > 1) label += ` · group ${line.group}`;
    if (ranks.size > 1) label += ` · rank ${line.rank}`;
    return label;
  }

  private seriesOptions(line: Line): uPlot.Series {
    const phase = panelOf(line.name).phase;
    const colour =
      this.groups.size > 1 || !phase
        ? GROUP_COLOURS[line.group % GROUP_COLOURS.length]
        : PHASE_COLOURS[phase];
    const sparse = phase === "test" || phase === "val"; // evaluations: a point now and then
    return {
      label: this.label(line),
      stroke: colour,
      width: sparse ? 2 : 1.5,
      dash: sparse && this.groups.size > 1 ? [6, 4] : undefined,
      spanGaps: true,
      // Markers on evaluation points while they are few enough to tell apart.
      points: { show: () => sparse && line.xs.length <= SPARSE_POINTS, size: 5, fill: colour },
      value: hoverValue(atStep),
    };
  }

  private draw(panel: Panel): void {
    const lines = panel.lines.filter((l) => l.xs.length > 0);
    const data = uPlot.join(lines.map((l) => [l.xs, l.ys] as uPlot.AlignedData));
    panel.el.dataset.points = String(lines.reduce((n, l) => n + l.xs.length, 0));
    panel.latest.textContent = lines
      .map((l) => `${this.label(l)} ${formatValue(l.ys[l.ys.length - 1])}`)
      .join("   ");
    const shape = lines.map((l) => this.label(l)).join("|") + `#${this.groups.size}`;
    if (lines.length === 0) return;
    if (panel.plot && panel.shape === shape) {
      panel.plot.setData(data);
      return;
    }
    panel.plot?.destroy();
    panel.shape = shape;
    panel.plot = new uPlot(
      {
        ...this.size(panel),
        scales: { x: { time: false } },
        axes: [
          { label: "step", labelSize: 16, size: 36 },
          { size: 56, values: (_u, ticks) => ticks.map((t) => formatValue(t)) },
        ],
        legend: { live: true },
        cursor: { drag: { x: true, y: false } },
        series: [{ label: "step", value: (_u, step) => (step === null ? "" : String(step)) }, ...lines.map((l) => this.seriesOptions(l))],
      },
      data,
      panel.plotHost,
    );
  }
}
