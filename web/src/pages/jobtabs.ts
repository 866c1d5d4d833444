// The job detail tabs that fetch their own data: graph, pipeline, events, logs, checkpoints and
// the job's batch prediction runs; and its YAML.

import {
  type Pipeline,
  type PredictionOut,
  type StageTimeline,
  TERMINAL,
  api,
  effectiveYaml,
  isPipelined,
} from "../api";
import { fill, formatBytes, formatCount, formatTime, h } from "../dom";
import { type Scope, errorText } from "../scope";
import { type LineMark, yamlEditor } from "../components/editor";
import { drawGraph, stageKey } from "../components/graph";
import { drawTimeline } from "../components/timeline";
import { errorBox, fact, stateBadge, table } from "../components/widgets";
import type { JobContext } from "./job";

const MAX_LOG_LINES = 5000;
const LOG_POLL_MS = 1000;
const BUSY = "train/pipeline/busy";

export function graphTab(pane: HTMLElement, ctx: JobContext): void {
  const host = h("div", { class: "graph-host", id: "graph" }, h("p", { class: "muted" }, "compiling…"));
  const note = h("span", { class: "muted" }, "shapes are per sample; pdim = partition_dim");
  const legend = h(
    "div",
    { class: "legend", id: "graph-legend" },
    h("span", { class: "key kind-input" }, "input"),
    h("span", { class: "key kind-param" }, "has parameters"),
    h("span", { class: "key kind-plain" }, "no parameters"),
    h("span", { class: "key kind-loss" }, "loss"),
    note,
  );
  pane.append(legend, host);
  const job = ctx.job();
  // A pipelined job's layers are coloured by the stage that runs them instead of by kind.
  const planned = job && isPipelined(job) ? api.pipeline(ctx.id, ctx.scope.signal) : null;
  Promise.all([api.graph(ctx.id, ctx.scope.signal), planned])
    .then(([graph, plan]) => {
      const total = graph.nodes.reduce((n, node) => n + node.params, 0);
      // With virtual stages the plan's lists are pieces; a layer takes the colour of the stage
      // (worker) that runs its piece.
      const stageOf = plan
        ? new Map(
            plan.stages.flatMap((layers, piece) =>
              layers.map((name) => [name, plan.piece_stages[piece] ?? piece] as const),
            ),
          )
        : undefined;
      if (plan) fill(legend, ...Array.from({ length: stageCount(plan) }, (_, stage) => stageKey(stage)), note);
      fill(
        host,
        h("p", { class: "muted" }, `${graph.nodes.length} layers, ${formatCount(total)} parameters`),
        drawGraph(graph, stageOf),
      );
    })
    .catch((error) => fill(host, errorBox(errorText(error))));
}

/** What a (replica, stage) reported last, and at which step. */
interface Latest<T> {
  step: number;
  value: T;
}

/** A history value, unless what is shown (perhaps live, which may come first) is newer. */
function keepNewer<T>(into: Map<string, Latest<T>>, key: string, step: number, value: T): void {
  if ((into.get(key)?.step ?? -1) <= step) into.set(key, { step, value });
}

/** One row of the plan's table: a piece of the net (a stage, without virtual stages). */
interface PlanRow {
  piece: number;
  stage: number;
  layers: string[];
}

/** The stages (workers) of a pipeline: its pieces over the pieces each stage runs. */
function stageCount(p: Pipeline): number {
  return Math.max(1, Math.floor(p.stages.length / Math.max(1, p.virtual_stages)));
}

export function pipelineTab(pane: HTMLElement, ctx: JobContext): void {
  const plan = h("div", { id: "pipeline-plan" }, h("p", { class: "muted" }, "loading…"));
  const chart = h("div", { class: "graph-host", id: "pipeline-timeline" });
  pane.append(
    plan,
    h(
      "div",
      { class: "legend" },
      h("span", { class: "key forward" }, "forward (F)"),
      h("span", { class: "key backward" }, "backward (B)"),
      h("span", { class: "key weight" }, "weight gradients (W, zero-bubble schedules)"),
      h("span", { class: "key later-piece" }, "a stage's later piece"),
      h("span", { class: "muted" }, "each stage's latest timed step; bars are numbered by micro-batch"),
    ),
    chart,
  );
  let pipeline: Pipeline | null = null;
  // By `${replica}/${stage}`. A live event is always the newest (a job placed again reports
  // lower steps); history fills in where nothing newer is shown.
  const timelines = new Map<string, Latest<StageTimeline>>();
  const busy = new Map<string, Latest<number>>();

  const drawPlan = (p: Pipeline) =>
    fill(
      plan,
      h(
        "div",
        { class: "facts card" },
        fact("stages", String(stageCount(p))),
        p.virtual_stages > 1 ? fact("pieces per stage", String(p.virtual_stages)) : null,
        fact("micro-batches", String(p.microbatches)),
        fact("schedule", p.schedule),
        fact("replicas", String(p.replicas)),
        fact("rematerialize", p.rematerialize ? "yes" : "no"),
      ),
      h(
        "div",
        { class: "table-wrap narrow" },
        table(
          [
            ...(p.virtual_stages > 1 ? [{ title: "piece", cell: (s: PlanRow) => String(s.piece) }] : []),
            { title: "stage", cell: (s: PlanRow) => stageKey(s.stage) },
            { title: "layers", cell: (s: PlanRow) => s.layers.join(", ") },
          ],
          p.stages.map((layers, piece) => ({ piece, stage: p.piece_stages[piece] ?? piece, layers })),
        ),
      ),
    );
  const drawChart = () => {
    const p = pipeline;
    if (!p) return;
    const stages = stageCount(p);
    // One chart per replica (each a whole pipeline), its rows the stages.
    const charts = Array.from({ length: p.replicas }, (_, group) => {
      const rows: StageTimeline[] = [];
      const fractions = new Map<number, number>();
      for (let stage = 0; stage < stages; stage++) {
        const timeline = timelines.get(`${group}/${stage}`);
        if (timeline !== undefined) rows.push(timeline.value);
        const fraction = busy.get(`${group}/${stage}`);
        if (fraction !== undefined) fractions.set(stage, fraction.value);
      }
      return h(
        "div",
        { class: "pipeline-replica", "data-replica": group },
        p.replicas > 1 ? h("h3", {}, `replica ${group}`) : null,
        drawTimeline(stages, rows, fractions, p.piece_stages),
      );
    });
    const waiting = h("p", { class: "muted" }, "No timeline yet: the stages time a step every disp_freq steps.");
    fill(chart, timelines.size === 0 ? waiting : null, ...charts);
  };

  const load = async () => {
    const [fresh, metrics] = await Promise.all([
      api.pipeline(ctx.id, ctx.scope.signal),
      api.metrics(ctx.id, 1, ctx.scope.signal, [BUSY]),
    ]);
    pipeline = fresh;
    for (const t of fresh.timelines) keepNewer(timelines, `${t.group}/${t.rank}`, t.step, t);
    for (const series of metrics.series) {
      const [step, value] = series.points[series.points.length - 1] ?? [0, null];
      if (value !== null) keepNewer(busy, `${series.group}/${series.rank}`, step, value);
    }
    drawPlan(fresh);
    drawChart();
  };
  const reload = () => void load().catch((error) => fill(plan, errorBox(errorText(error))));
  ctx.on("timeline", (t) => {
    timelines.set(`${t.group}/${t.rank}`, { step: t.step, value: t });
    drawChart();
  });
  ctx.on("metric", (m) => {
    const value = m.values[BUSY];
    if (typeof value !== "number") return;
    busy.set(`${m.group}/${m.rank}`, { step: m.step, value });
    drawChart();
  });
  // After the job ends, the rows the ingester stored last.
  ctx.on("state", reload);
  reload();
}

export function eventsTab(pane: HTMLElement, ctx: JobContext): void {
  const list = h("ol", { class: "timeline", id: "events" });
  pane.append(list);
  const load = async () => {
    const events = await api.events(ctx.id, ctx.scope.signal);
    fill(
      list,
      ...events.map((e) =>
        h(
          "li",
          { class: `state-${e.state.toLowerCase()}` },
          h("time", { class: "num" }, formatTime(e.at)),
          stateBadge(e.state),
          h("span", {}, e.reason),
        ),
      ),
    );
  };
  const reload = () => void load().catch((error) => fill(list, errorBox(errorText(error))));
  ctx.on("state", reload);
  ctx.on("event", reload);
  reload();
}

export function logsTab(pane: HTMLElement, ctx: JobContext): void {
  const follow = h("input", { type: "checkbox", id: "follow", checked: true });
  const out = h("pre", { class: "logs", id: "logs" });
  const note = h("span", { class: "muted", id: "logs-note" });
  pane.append(
    h("div", { class: "toolbar" }, h("label", { class: "inline" }, follow, "follow"), note),
    out,
  );
  let after: number | null = null;
  let shown = 0;
  let loaded = false;

  // Pages through new lines from `after`; follow keeps the newest line in view.
  const fetchNew = async () => {
    for (;;) {
      const page = await api.logs(ctx.id, after, ctx.scope.signal);
      if (page.lines.length === 0) break;
      const text = page.lines
        .map((l) => `${formatTime(l.at)}  [g${l.group} r${l.rank}]  ${l.line}\n`)
        .join("");
      out.append(document.createTextNode(text));
      shown += page.lines.length;
      after = page.next;
      if (page.lines.length < 500) break;
    }
    while (shown > MAX_LOG_LINES && out.firstChild) {
      const first = out.firstChild;
      shown -= (first.textContent ?? "").split("\n").length - 1;
      first.remove();
    }
    loaded = true;
    note.textContent = shown === 0 ? "no log lines yet" : `${shown.toLocaleString()} lines`;
    if (follow.checked) out.scrollTop = out.scrollHeight;
  };
  ctx.scope.every(
    LOG_POLL_MS,
    async () => {
      const job = ctx.job();
      if (!loaded || (follow.checked && !pane.hidden && job && !TERMINAL.has(job.state))) {
        await fetchNew();
      }
    },
    (error) => (note.textContent = errorText(error)),
  );
  // After the job ends, one last read picks up its final lines.
  ctx.on("state", () => void fetchNew().catch(() => undefined));
}

export function checkpointsTab(pane: HTMLElement, ctx: JobContext): void {
  const host = h("div", { id: "checkpoints", class: "table-wrap narrow" });
  pane.append(host);
  const download = async (step: number, button: HTMLButtonElement) => {
    button.disabled = true;
    try {
      // A plain link cannot carry the bearer token: fetch, then save the blob.
      const blob = await api.checkpointFile(ctx.id, step);
      const link = h("a", {
        href: URL.createObjectURL(blob),
        download: `${ctx.job()?.name ?? `job-${ctx.id}`}-step${step}.safetensors`,
      });
      link.click();
      setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
    } catch (error) {
      alert(`Download failed: ${errorText(error)}`);
    } finally {
      button.disabled = false;
    }
  };
  const load = async () => {
    const rows = await api.checkpoints(ctx.id, ctx.scope.signal);
    fill(
      host,
      table(
        [
          { title: "step", cell: (c) => c.step.toLocaleString(), className: "num" },
          {
            title: "",
            cell: (c) => (c.best ? h("span", { class: "badge best-badge", title: "the objective's best step (keep_best)" }, "best") : ""),
          },
          { title: "size", cell: (c) => formatBytes(c.size), className: "num" },
          { title: "saved", cell: (c) => formatTime(c.created_at), className: "num" },
          {
            title: "",
            cell: (c) => {
              const button = h("button", {}, "Download");
              button.addEventListener("click", () => void download(c.step, button));
              return button;
            },
          },
        ],
        rows,
        { empty: "No checkpoints yet.", rowAttrs: (c) => ({ "data-step": String(c.step), ...(c.best ? { "data-best": "" } : {}) }) },
      ),
    );
  };
  const reload = () => void load().catch((error) => fill(host, errorBox(errorText(error))));
  ctx.on("checkpoint", reload);
  ctx.on("state", reload);
  reload();
}

const PREDICTIONS_POLL_MS = 1000;

// The job's batch prediction runs (POST /jobs/{id}/predictions, and those of the models
// registered from it): state, progress, the scores' download once a run has succeeded.
export function predictionsTab(pane: HTMLElement, ctx: JobContext): void {
  const host = h("div", { id: "predictions", class: "table-wrap" });
  pane.append(
    h("p", { class: "muted" }, "Batch prediction on the cluster: trainyard predict JOB --dataset NAME --workers N"),
    host,
  );
  predictionRuns(host, ctx.scope, (signal) => api.predictions(ctx.id, signal), "No prediction runs of this job.");
}

/** Prediction runs as a table, each linked to its own page, read again every second while a
 * run is still going. */
export function predictionRuns(
  host: HTMLElement,
  scope: Scope,
  fetchRuns: (signal: AbortSignal) => Promise<PredictionOut[]>,
  empty: string,
): void {
  const download = async (id: number, dataset: string, button: HTMLButtonElement) => {
    button.disabled = true;
    try {
      const blob = await api.predictionOutput(id);
      const link = h("a", { href: URL.createObjectURL(blob), download: `predictions-${id}-${dataset}.npy` });
      link.click();
      setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
    } catch (error) {
      alert(`Download failed: ${errorText(error)}`);
    } finally {
      button.disabled = false;
    }
  };
  let timer: ReturnType<typeof setTimeout> | undefined;
  scope.onDispose(() => clearTimeout(timer));
  const load = async () => {
    const rows = await fetchRuns(scope.signal);
    fill(
      host,
      table(
        [
          { title: "run", cell: (p) => h("a", { href: `#/jobs/${p.run_job_id}`, class: "run-link" }, `#${p.id}`), className: "num" },
          { title: "model", cell: (p) => p.model ?? (p.job_id === null ? "—" : `job #${p.job_id}`) },
          { title: "dataset", cell: (p) => p.dataset },
          { title: "state", cell: (p) => stateBadge(p.state) },
          {
            title: "progress",
            cell: (p) =>
              h(
                "span",
                { class: "prediction-progress", title: `${formatCount(p.rows_done)} of ${formatCount(p.rows)} rows` },
                h("progress", { max: "1", value: String(p.progress) }),
                ` ${Math.round(p.progress * 100)}%`,
              ),
          },
          { title: "rows", cell: (p) => formatCount(p.rows), className: "num" },
          { title: "workers", cell: (p) => String(p.workers), className: "num" },
          { title: "step", cell: (p) => p.step.toLocaleString(), className: "num" },
          { title: "started", cell: (p) => formatTime(p.created_at), className: "num" },
          {
            title: "",
            cell: (p) => {
              if (p.state !== "SUCCEEDED") return p.error ? h("span", { class: "muted" }, p.error) : "";
              const button = h("button", {}, "Download");
              button.addEventListener("click", () => void download(p.id, p.dataset, button));
              return button;
            },
          },
        ],
        rows,
        {
          empty,
          rowAttrs: (p) => ({ "data-prediction": String(p.id), "data-state": p.state }),
        },
      ),
    );
    if (rows.some((p) => !TERMINAL.has(p.state)) && !scope.signal.aborted) {
      timer = setTimeout(reload, PREDICTIONS_POLL_MS);
    }
  };
  const reload = () => void load().catch((error) => fill(host, errorBox(errorText(error))));
  reload();
}

/** An override as `--set` writes it. */
function setFlag(path: string, value: unknown): string {
  return `--set ${path}=${typeof value === "string" ? value : JSON.stringify(value)}`;
}

/** The document the job runs (its overrides applied, each marked on its line), and the one
 * submitted. */
export function yamlTab(pane: HTMLElement, ctx: JobContext): void {
  const job = ctx.job();
  if (!job) return;
  const overrides = Object.entries(job.overrides);
  const lines = job.override_lines ?? {};
  const marks: LineMark[] = overrides.flatMap(([path, value]) =>
    lines[path] === undefined ? [] : [{ line: lines[path], note: setFlag(path, value) }],
  );
  const host = h("div", { id: "yaml-effective" });
  if (overrides.length > 0) {
    pane.append(
      h(
        "p",
        { class: "muted", id: "yaml-overrides" },
        `Submitted with ${overrides.map(([path, value]) => setFlag(path, value)).join(" ")}; ` +
          "the document below has them applied, each marked on its line.",
      ),
    );
  }
  pane.append(host);
  const view = yamlEditor(host, { doc: effectiveYaml(job), readOnly: true, marks });
  ctx.scope.onDispose(() => view.destroy());
  if (overrides.length > 0) {
    pane.append(
      h(
        "details",
        { id: "yaml-submitted" },
        h("summary", {}, "As submitted, before the overrides"),
        h("pre", { class: "yaml-submitted" }, job.spec_yaml ?? ""),
      ),
    );
  }
}
