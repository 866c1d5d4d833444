// One pipeline's latest step as an SVG chart: a row per stage, a bar per forward (F), backward
// (B) and, where a zero-bubble schedule splits the backward, weight-gradient pass (W) of each
// micro-batch, labelled with the micro-batch's number; the gaps in a row are the stage's bubble.
// A stage that runs several pieces of the net (virtual stages) outlines its later pieces' bars
// dashed. Each stage times its own step, so the rows share a scale but not a clock.

import type { StageTimeline } from "../api";
import { svg } from "../dom";
import { stageColour } from "./graph";

const WIDTH = 860;
const LABEL_W = 104;
const BUSY_W = 84;
const ROW_H = 34;
const BAR_H = 22;
const AXIS_H = 28;
const PAD = 8;

/** Tick spacing of about six ticks over `span`: 1, 2 or 5 times a power of ten. */
function tickStep(span: number): number {
  const raw = span / 6;
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * power).find((step) => step >= raw) ?? raw;
}

function formatMs(seconds: number): string {
  return `${Number((seconds * 1000).toPrecision(3))} ms`;
}

const PASSES: Record<string, string> = {
  F: "forward",
  B: "backward",
  W: "weight gradients",
};

/**
 * `timelines` are one replica's (by stage, some perhaps missing); `busy` is each stage's latest
 * `train/pipeline/busy`, the fraction of its step it spent computing; `pieceStages` the stage
 * that runs each piece of the net (one piece per stage without virtual stages).
 */
export function drawTimeline(
  stages: number,
  timelines: StageTimeline[],
  busy: Map<number, number>,
  pieceStages: number[] = [],
): SVGSVGElement {
  // A piece's place among its stage's pieces: 0 for the first, which is drawn plain.
  const order = new Map<number, number>();
  pieceStages.forEach((stage, piece) => order.set(piece, pieceStages.slice(0, piece).filter((s) => s === stage).length));
  const byStage = new Map(timelines.map((t) => [t.rank, t]));
  const span = Math.max(1e-6, ...timelines.flatMap((t) => t.events.map((e) => e.end)));
  const plotW = WIDTH - LABEL_W - BUSY_W - 2 * PAD;
  const x = (seconds: number) => LABEL_W + PAD + (seconds / span) * plotW;
  const height = PAD + stages * ROW_H + AXIS_H;
  const root = svg("svg", {
    class: "pipeline-chart",
    width: WIDTH,
    height,
    viewBox: `0 0 ${WIDTH} ${height}`,
    role: "img",
    "aria-label": `timeline of ${stages} pipeline stages`,
  });
  for (let stage = 0; stage < stages; stage++) {
    const timeline = byStage.get(stage);
    const fraction = busy.get(stage);
    const top = PAD + stage * ROW_H;
    const barY = top + (ROW_H - BAR_H) / 2;
    const row = svg(
      "g",
      { class: "stage-row", "data-stage": stage, style: `--stage: ${stageColour(stage)}` },
      svg("text", { x: 0, y: top + 14, class: "stage-name" }, `stage ${stage}`),
      svg("text", { x: 0, y: top + 28, class: "stage-step" }, timeline ? `step ${timeline.step}` : "not timed yet"),
      svg("rect", { class: "track", x: x(0), y: barY, width: plotW, height: BAR_H, rx: 3 }),
      svg(
        "text",
        { x: WIDTH - PAD, y: top + 21, class: "stage-busy", "text-anchor": "end" },
        fraction === undefined ? "busy —" : `busy ${Math.round(fraction * 100)}%`,
      ),
    );
    for (const e of timeline?.events ?? []) {
      const left = x(e.start);
      const width = Math.max(2, x(e.end) - left);
      const what = PASSES[e.kind] ?? e.kind;
      const later = (order.get(e.piece) ?? 0) > 0 ? " later-piece" : "";
      const piece = pieceStages.length > stages ? ` on piece ${e.piece}` : "";
      row.append(
        svg(
          "g",
          {
            class: `bar bar-${e.kind}${later}`,
            "data-kind": e.kind,
            "data-microbatch": e.microbatch,
            "data-piece": e.piece,
          },
          svg("title", {}, `${what} of micro-batch ${e.microbatch}${piece}: ${formatMs(e.start)} – ${formatMs(e.end)}`),
          svg("rect", { x: left, y: barY, width, height: BAR_H, rx: 2 }),
          svg("text", { x: left + width / 2, y: barY + 15, "text-anchor": "middle" }, String(e.microbatch)),
        ),
      );
    }
    root.append(row);
  }
  const axisY = PAD + stages * ROW_H + 4;
  const axis = svg("g", { class: "axis" }, svg("line", { x1: x(0), x2: x(span), y1: axisY, y2: axisY }));
  const step = tickStep(span);
  for (let i = 0; i * step <= span * (1 + 1e-9); i++) {
    const at = x(i * step);
    axis.append(
      svg("line", { x1: at, x2: at, y1: axisY, y2: axisY + 4 }),
      svg("text", { x: at, y: axisY + 17, "text-anchor": "middle" }, formatMs(i * step)),
    );
  }
  root.append(axis);
  return root;
}
