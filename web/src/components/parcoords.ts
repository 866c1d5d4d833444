// A sweep's trials in parallel coordinates, plain SVG: a vertical axis per searched parameter
// (log for loguniform, categorical for choice) and per metric, and a line per trial through its
// values, coloured from worst (dark) to best (yellow). Pruned trials are dashed; the best is
// drawn thicker, on top.

import { formatValue, svg } from "../dom";
import { type Scale, position, rampColour, ticks } from "./scales";

const WIDTH = 900;
const HEIGHT = 300;
const TOP = 26;
const BOTTOM = 14;
const SIDE = 70;

export interface PcAxis {
  /** the parameter's path or the metric's name */
  key: string;
  scale: Scale;
  /** a metric axis (drawn bold) */
  metric: boolean;
}

export interface PcLine {
  trial: number;
  /** one value per axis, in the axes' order */
  values: unknown[];
  /** 0 for the worst trial drawn, 1 for the best */
  goodness: number;
  pruned: boolean;
  best: boolean;
}

/** The last part of a dotted path, short enough for an axis title. */
export function shortName(path: string): string {
  const parts = path.split(".");
  const tail = parts.slice(-2).join(".");
  return tail.length > 22 ? parts[parts.length - 1] : tail;
}

export function drawParcoords(axes: PcAxis[], lines: PcLine[]): SVGSVGElement {
  const plotH = HEIGHT - TOP - BOTTOM;
  const gap = axes.length > 1 ? (WIDTH - 2 * SIDE) / (axes.length - 1) : 0;
  const x = (i: number) => (axes.length > 1 ? SIDE + i * gap : WIDTH / 2);
  const y = (fraction: number) => TOP + (1 - fraction) * plotH;
  const root = svg("svg", {
    class: "sweep-chart parcoords",
    width: WIDTH,
    height: HEIGHT,
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    "aria-label": `parallel coordinates of ${lines.length} trials over ${axes.length} axes`,
  });

  const drawn = svg("g", { class: "pc-lines" });
  // Worst first, so the better trials lie on top; the best last of all.
  const order = [...lines].sort((a, b) => Number(a.best) - Number(b.best) || a.goodness - b.goodness);
  for (const line of order) {
    const points: string[] = [];
    line.values.forEach((value, i) => {
      const at = position(axes[i].scale, value);
      if (at !== null) points.push(`${x(i).toFixed(1)},${y(at).toFixed(1)}`);
    });
    if (points.length < 2) continue;
    const label = axes.map((a, i) => `${a.key} = ${show(line.values[i])}`).join("\n");
    const attrs: Record<string, string | number> = {
      class: `pc-line${line.pruned ? " pruned" : ""}${line.best ? " best" : ""}`,
      "data-trial": line.trial,
      d: `M${points.join("L")}`,
      stroke: rampColour(line.goodness),
    };
    if (line.pruned) attrs["stroke-dasharray"] = "5 4";
    drawn.append(svg("path", attrs, svg("title", {}, `trial ${line.trial}${line.pruned ? " (pruned)" : ""}\n${label}`)));
  }

  const axisGroup = svg("g", { class: "pc-axes" });
  axes.forEach((axis, i) => {
    const g = svg("g", {
      class: `pc-axis${axis.metric ? " metric" : ""}`,
      "data-axis": axis.key,
      "data-scale": axis.scale.kind,
    });
    g.append(
      svg("line", { x1: x(i), x2: x(i), y1: TOP, y2: TOP + plotH }),
      svg(
        "text",
        { x: x(i), y: TOP - 16, "text-anchor": "middle", class: "pc-title" },
        svg("title", {}, axis.key),
        shortName(axis.key) + (axis.scale.kind === "log" ? " (log)" : ""),
      ),
    );
    for (const tick of ticks(axis.scale, 4)) {
      const ty = y(tick.at);
      g.append(
        svg("line", { x1: x(i) - 4, x2: x(i), y1: ty, y2: ty }),
        svg("text", { x: x(i) - 7, y: ty + 4, "text-anchor": "end", class: "pc-tick" }, tick.label),
      );
    }
    axisGroup.append(g);
  });
  root.append(drawn, axisGroup);
  return root;
}

function show(value: unknown): string {
  return typeof value === "number" ? formatValue(value) : String(value);
}
