// A sweep's other charts, plain SVG on x/y frames: the metric against step for every trial
// (pruned ones dashed, with an ✕ at the rung they stopped at), the Pareto front of two
// objectives, parameter importance as bars, and population-based training's schedules of a
// hyperparameter over steps.

import { formatValue, svg } from "../dom";
import { type Scale, linearScale, position, ticks } from "./scales";

const WIDTH = 900;
const HEIGHT = 280;
const LEFT = 62;
const RIGHT = 16;
const TOP = 12;
const BOTTOM = 38;

interface Frame {
  root: SVGSVGElement;
  x: (value: unknown) => number;
  y: (value: unknown) => number;
}

/** An SVG with both axes drawn; `x` and `y` map values to pixels (NaN when off the scale). */
function frame(cls: string, label: string, xs: Scale, ys: Scale, xTitle: string, yTitle: string): Frame {
  const plotW = WIDTH - LEFT - RIGHT;
  const plotH = HEIGHT - TOP - BOTTOM;
  const x = (v: unknown) => LEFT + (position(xs, v) ?? Number.NaN) * plotW;
  const y = (v: unknown) => TOP + (1 - (position(ys, v) ?? Number.NaN)) * plotH;
  const root = svg("svg", {
    class: `sweep-chart ${cls}`,
    width: WIDTH,
    height: HEIGHT,
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    "aria-label": label,
  });
  const axes = svg(
    "g",
    { class: "axis" },
    svg("line", { x1: LEFT, x2: LEFT + plotW, y1: TOP + plotH, y2: TOP + plotH }),
    svg("line", { x1: LEFT, x2: LEFT, y1: TOP, y2: TOP + plotH }),
    svg("text", { x: LEFT + plotW / 2, y: HEIGHT - 4, "text-anchor": "middle", class: "axis-title" }, xTitle),
    svg(
      "text",
      { x: 12, y: TOP + plotH / 2, "text-anchor": "middle", class: "axis-title", transform: `rotate(-90 12 ${TOP + plotH / 2})` },
      yTitle,
    ),
  );
  for (const tick of ticks(xs, 8)) {
    const at = LEFT + tick.at * plotW;
    axes.append(
      svg("line", { x1: at, x2: at, y1: TOP + plotH, y2: TOP + plotH + 4 }),
      svg("text", { x: at, y: TOP + plotH + 16, "text-anchor": "middle" }, tick.label),
    );
  }
  for (const tick of ticks(ys, 5)) {
    const at = TOP + (1 - tick.at) * plotH;
    axes.append(
      svg("line", { class: "grid-line", x1: LEFT, x2: LEFT + plotW, y1: at, y2: at }),
      svg("text", { x: LEFT - 6, y: at + 4, "text-anchor": "end" }, tick.label),
    );
  }
  root.append(axes);
  return { root, x, y };
}

export interface Curve {
  trial: number;
  /** [step, value] in step order */
  points: [number, number][];
  colour: string;
  /** PRUNED: the rung it stopped at */
  prunedStep: number | null;
  best: boolean;
}

/** The metric against step, a line per trial; a pruned trial's is dashed, with an ✕ at its rung. */
export function drawCurves(curves: Curve[], metric: string, lastStep: number): SVGSVGElement {
  const drawn = curves.filter((c) => c.points.length > 0);
  const xs: Scale = { kind: "linear", low: 0, high: Math.max(1, lastStep), categories: [] };
  const ys = linearScale(drawn.flatMap((c) => c.points.map((p) => p[1])));
  const f = frame("trial-curves", `${metric} against step for ${drawn.length} trials`, xs, ys, "step", metric);
  const lines = svg("g", { class: "curves" });
  for (const curve of [...drawn].sort((a, b) => Number(a.best) - Number(b.best))) {
    const pruned = curve.prunedStep !== null;
    const attrs: Record<string, string | number> = {
      class: `trial-line${pruned ? " pruned" : ""}${curve.best ? " best" : ""}`,
      "data-trial": curve.trial,
      stroke: curve.colour,
      d: `M${curve.points.map(([s, v]) => `${f.x(s).toFixed(1)},${f.y(v).toFixed(1)}`).join("L")}`,
    };
    if (pruned) attrs["stroke-dasharray"] = "6 4";
    const last = curve.points[curve.points.length - 1];
    const title = `trial ${curve.trial}: ${formatValue(last[1])} at step ${last[0]}`;
    lines.append(svg("path", attrs, svg("title", {}, pruned ? `${title}, pruned at ${curve.prunedStep}` : title)));
    if (curve.points.length === 1) {
      lines.append(svg("circle", { class: "trial-dot", cx: f.x(last[0]), cy: f.y(last[1]), r: 3, fill: curve.colour }));
    }
    if (pruned) {
      const rung = curve.prunedStep as number;
      // The rung's value: the last point the pruner had seen when it stopped the trial.
      const seen = [...curve.points].reverse().find(([s]) => s <= rung) ?? last;
      lines.append(
        svg(
          "text",
          {
            class: "prune-mark",
            "data-trial": curve.trial,
            x: f.x(rung),
            y: f.y(seen[1]) + 5,
            "text-anchor": "middle",
            fill: curve.colour,
          },
          svg("title", {}, `trial ${curve.trial} pruned at step ${rung}`),
          "✕",
        ),
      );
    }
  }
  f.root.append(lines);
  return f.root;
}

export interface ParetoPoint {
  trial: number;
  x: number;
  y: number;
  front: boolean;
}

/** Two objectives against each other; the front's points are ringed and joined in order. */
export function drawPareto(points: ParetoPoint[], xTitle: string, yTitle: string): SVGSVGElement {
  const xs = linearScale(points.map((p) => p.x));
  const ys = linearScale(points.map((p) => p.y));
  const f = frame("pareto", `${points.length} trials, ${xTitle} against ${yTitle}`, xs, ys, xTitle, yTitle);
  const front = points.filter((p) => p.front).sort((a, b) => a.x - b.x || a.y - b.y);
  if (front.length > 1) {
    const d = front.map((p) => `${f.x(p.x).toFixed(1)},${f.y(p.y).toFixed(1)}`).join("L");
    f.root.append(svg("path", { class: "front-line", d: `M${d}` }));
  }
  for (const p of [...points].sort((a, b) => Number(a.front) - Number(b.front))) {
    f.root.append(
      svg(
        "circle",
        {
          class: `pareto-point${p.front ? " on-front" : ""}`,
          "data-trial": p.trial,
          cx: f.x(p.x),
          cy: f.y(p.y),
          r: p.front ? 6 : 4,
        },
        svg("title", {}, `trial ${p.trial}: ${xTitle} ${formatValue(p.x)}, ${yTitle} ${formatValue(p.y)}`),
      ),
    );
  }
  return f.root;
}

/** Horizontal bars of each parameter's importance, largest first (they sum to about 1). */
export function drawImportance(importances: Record<string, number>): SVGSVGElement {
  const rows = Object.entries(importances).sort((a, b) => b[1] - a[1]);
  const labelW = 260;
  const rowH = 24;
  const height = rows.length * rowH + 8;
  const barW = WIDTH - labelW - 70;
  const most = Math.max(1e-9, ...rows.map((r) => r[1]));
  const root = svg("svg", {
    class: "sweep-chart importance",
    width: WIDTH,
    height,
    viewBox: `0 0 ${WIDTH} ${height}`,
    role: "img",
    "aria-label": `importance of ${rows.length} parameters`,
  });
  rows.forEach(([path, value], i) => {
    const top = 4 + i * rowH;
    root.append(
      svg(
        "g",
        { class: "importance-bar", "data-param": path },
        svg("text", { x: labelW - 8, y: top + 15, "text-anchor": "end" }, path),
        svg("rect", { x: labelW, y: top + 3, width: Math.max(1, (value / most) * barW), height: rowH - 8, rx: 2 }),
        svg("text", { x: labelW + (value / most) * barW + 6, y: top + 15, class: "value" }, formatValue(value)),
      ),
    );
  });
  return root;
}

export interface ScheduleLine {
  trial: number;
  colour: string;
  /** the value from each step on, in step order */
  steps: [number, unknown][];
  /** where it continued from another trial's checkpoint */
  exploits: { step: number; from: number }[];
  /** the trial's latest step, where its last value ends */
  until: number;
}

/** One hyperparameter over steps under PBT: a step line per trial, a ring at each exploit. */
export function drawSchedule(path: string, scale: Scale, lines: ScheduleLine[], lastStep: number): SVGSVGElement {
  const xs: Scale = { kind: "linear", low: 0, high: Math.max(1, lastStep), categories: [] };
  const f = frame("schedule", `${path} over steps for ${lines.length} trials`, xs, scale, "step", path);
  for (const line of lines) {
    const d: string[] = [];
    line.steps.forEach(([step, value], i) => {
      const next = i + 1 < line.steps.length ? line.steps[i + 1][0] : Math.max(step, line.until);
      const y = f.y(value).toFixed(1);
      d.push(`${i === 0 ? "M" : "L"}${f.x(step).toFixed(1)},${y}`, `L${f.x(next).toFixed(1)},${y}`);
    });
    const g = svg(
      "g",
      { class: "schedule-line", "data-trial": line.trial },
      svg("path", { d: d.join(""), stroke: line.colour }, svg("title", {}, `trial ${line.trial}`)),
    );
    for (const exploit of line.exploits) {
      const value = [...line.steps].reverse().find(([s]) => s <= exploit.step)?.[1];
      g.append(
        svg(
          "circle",
          { class: "exploit", cx: f.x(exploit.step), cy: f.y(value), r: 4, stroke: line.colour },
          svg("title", {}, `trial ${line.trial} continued from trial ${exploit.from} at step ${exploit.step}`),
        ),
      );
    }
    f.root.append(g);
  }
  return f.root;
}
