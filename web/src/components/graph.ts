// The compiled net as an SVG drawing: layers placed in topological levels (a layer sits one level
// below its deepest source), ordered within a level by the mean position of their sources so
// edges cross little, and edges drawn as curves from a layer to the layers that read it. A
// pipelined job's layers take the colour of their stage instead of their kind's.

import type { Graph, GraphNode } from "../api";
import { formatCount, formatShape, h, svg } from "../dom";

const NODE_W = 190;
const NODE_H = 58;
const GAP_X = 28;
const GAP_Y = 38;
const PAD = 16;
const STAGE_COLOURS = ["#2563eb", "#16a34a", "#ea580c", "#9333ea", "#0891b2", "#db2777", "#ca8a04"];

/** A pipeline stage's colour, shared by the graph, its legend and the timeline chart. */
export function stageColour(stage: number): string {
  return STAGE_COLOURS[stage % STAGE_COLOURS.length];
}

/** "stage N" with a swatch of its colour, for legends and tables. */
export function stageKey(stage: number): HTMLElement {
  return h(
    "span",
    { class: "key staged", style: `--stage: ${stageColour(stage)}`, "data-stage": stage },
    `stage ${stage}`,
  );
}

interface Placed {
  node: GraphNode;
  level: number;
  x: number;
  y: number;
}

/** Levels by longest path from the inputs; a cycle (never produced by the compiler) raises. */
function layout(graph: Graph): Placed[] {
  const names = graph.nodes.map((n) => n.name);
  const sources = new Map<string, string[]>(names.map((n) => [n, []]));
  const targets = new Map<string, string[]>(names.map((n) => [n, []]));
  for (const e of graph.edges) {
    sources.get(e.target)?.push(e.source);
    targets.get(e.source)?.push(e.target);
  }
  const level = new Map<string, number>();
  const pending = new Map(names.map((n) => [n, sources.get(n)?.length ?? 0]));
  const ready = names.filter((n) => pending.get(n) === 0);
  for (const n of ready) level.set(n, 0);
  while (ready.length > 0) {
    const name = ready.shift() as string;
    for (const t of targets.get(name) ?? []) {
      level.set(t, Math.max(level.get(t) ?? 0, (level.get(name) ?? 0) + 1));
      const left = (pending.get(t) ?? 0) - 1;
      pending.set(t, left);
      if (left === 0) ready.push(t);
    }
  }
  if (level.size !== names.length) throw new Error("the net's graph has a cycle");

  const rows: string[][] = [];
  for (const name of names) {
    const l = level.get(name) ?? 0;
    (rows[l] ??= []).push(name);
  }
  // Order each level by the mean index of its sources in the level above (one downward sweep).
  const index = new Map<string, number>();
  for (const row of rows) {
    const key = (n: string) => {
      const src = (sources.get(n) ?? []).map((s) => index.get(s) ?? 0);
      return src.length ? src.reduce((a, b) => a + b, 0) / src.length : 0;
    };
    row.sort((a, b) => key(a) - key(b));
    row.forEach((n, i) => index.set(n, i));
  }
  const widest = Math.max(...rows.map((r) => r.length), 1);
  const fullWidth = widest * NODE_W + (widest - 1) * GAP_X;
  const byName = new Map(graph.nodes.map((n) => [n.name, n]));
  return rows.flatMap((row, l) => {
    const rowWidth = row.length * NODE_W + (row.length - 1) * GAP_X;
    const left = PAD + (fullWidth - rowWidth) / 2;
    return row.map((name, i) => ({
      node: byName.get(name) as GraphNode,
      level: l,
      x: left + i * (NODE_W + GAP_X),
      y: PAD + l * (NODE_H + GAP_Y),
    }));
  });
}

function kind(node: GraphNode): string {
  if (node.type === "input" || node.type.endsWith("_input")) return "input";
  if (node.type.includes("loss")) return "loss";
  if (node.params > 0) return "param";
  return "plain";
}

function truncate(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** `stageOf` (a pipelined job's layer -> stage) colours each layer by the stage that runs it. */
export function drawGraph(graph: Graph, stageOf?: Map<string, number>): SVGSVGElement {
  const placed = layout(graph);
  const at = new Map(placed.map((p) => [p.node.name, p]));
  const width = Math.max(...placed.map((p) => p.x + NODE_W), NODE_W) + PAD;
  const height = Math.max(...placed.map((p) => p.y + NODE_H), NODE_H) + PAD;
  const root = svg("svg", {
    class: "net-graph",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `network graph with ${graph.nodes.length} layers`,
  });
  root.append(
    svg(
      "defs",
      {},
      svg(
        "marker",
        { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
        svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow-head" }),
      ),
    ),
  );
  for (const e of graph.edges) {
    const a = at.get(e.source);
    const b = at.get(e.target);
    if (!a || !b) continue;
    const x1 = a.x + NODE_W / 2;
    const y1 = a.y + NODE_H;
    const x2 = b.x + NODE_W / 2;
    const y2 = b.y;
    const bend = Math.max(GAP_Y / 2, (y2 - y1) / 2);
    root.append(
      svg("path", {
        class: "edge",
        d: `M ${x1} ${y1} C ${x1} ${y1 + bend}, ${x2} ${y2 - bend}, ${x2} ${y2}`,
        "marker-end": "url(#arrow)",
      }),
    );
  }
  for (const p of placed) {
    const n = p.node;
    const detail = [formatShape(n.out_shape)];
    if (n.params > 0) detail.push(`${formatCount(n.params)} params`);
    const tags = [`pdim ${n.partition_dim}`];
    if (n.include) tags.push(`${n.include.join(", ")} only`);
    const title = [`${n.name} (${n.type})`, `output ${formatShape(n.out_shape)}`, `params ${n.params}`];
    const stage = stageOf?.get(n.name);
    const staged: Record<string, string | number> =
      stage === undefined ? {} : { style: `--stage: ${stageColour(stage)}`, "data-stage": stage };
    if (stage !== undefined) title.push(`pipeline stage ${stage}`);
    root.append(
      svg(
        "g",
        {
          class: `layer kind-${kind(n)}${stage === undefined ? "" : " staged"}`,
          transform: `translate(${p.x} ${p.y})`,
          "data-layer": n.name,
          ...staged,
        },
        svg("title", {}, title.join("\n")),
        svg("rect", { width: NODE_W, height: NODE_H, rx: 7 }),
        svg("text", { x: 10, y: 19, class: "layer-name" }, truncate(n.name, 16)),
        svg("text", { x: NODE_W - 10, y: 19, class: "layer-type", "text-anchor": "end" }, truncate(n.type, 14)),
        svg("text", { x: 10, y: 37, class: "layer-shape" }, truncate(detail.join(" · "), 28)),
        svg("text", { x: 10, y: 51, class: "layer-tags" }, tags.join(" · ")),
      ),
    );
  }
  return root;
}
