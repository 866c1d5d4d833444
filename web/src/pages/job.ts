// Job detail: a header with state, progress, downloads and actions, and tabs for the live charts (SSE), the
// compiled net, a pipelined job's stages and timelines, the events timeline, logs with follow,
// checkpoints, its prediction runs, the environment its workers trained in and the job's YAML (the
// document it runs, its overrides marked). A prediction run's job shows the rows it scored and
// only the events, logs and environment.

import {
  ApiError,
  type Job,
  type JobFile,
  type StageTimeline,
  type PredictionOut,
  TERMINAL,
  api,
  effectiveYaml,
  isPipelined,
  streamUrl,
} from "../api";
import { fill, formatDuration, formatTime, h } from "../dom";
import type { Params, Scope } from "../scope";
import { errorText } from "../scope";
import { MAX_POINTS, MetricCharts } from "../components/charts";
import { DRAFT_KEY } from "../components/editor";
import { errorBox, fact, progressBar, stateBadge, warningBox } from "../components/widgets";
import { bestOf } from "./jobs";
import { environmentTab } from "./environment";
import { checkpointsTab, eventsTab, graphTab, logsTab, pipelineTab, predictionsTab, yamlTab } from "./jobtabs";

const TABS = ["charts", "graph", "pipeline", "events", "logs", "checkpoints", "predictions", "environment", "yaml"] as const;
type Tab = (typeof TABS)[number];
/** A prediction run's job (its kind `prediction`) trains nothing: it has no training tabs. */
const PREDICTION_TABS: readonly Tab[] = ["events", "logs", "environment"];
/** Whether a job is a prediction run: its workers score a dataset's rows, they train nothing. */
const scoresRows = (j: Job): boolean => j.kind === "prediction";
const REFRESH_MS = 2000;

/** A live `metric` event: one worker's values at a step (null: NaN or infinite). */
interface MetricEvent {
  step: number;
  group: number;
  rank: number;
  values: Record<string, number | null>;
}

/** What open tabs hear of the job as it happens: the stream's records, and state changes. */
interface LiveEvents {
  log: void;
  checkpoint: void;
  /** the job's own events (it stopped early): the events tab reads them again */
  event: void;
  state: void;
  metric: MetricEvent;
  timeline: StageTimeline;
}
type Listeners = { [K in keyof LiveEvents]: ((data: LiveEvents[K]) => void)[] };

export interface JobContext {
  id: number;
  scope: Scope;
  job: () => Job | null;
  /** Called with each live event of a kind so open tabs can refresh themselves. */
  on: <K extends keyof LiveEvents>(kind: K, fn: (data: LiveEvents[K]) => void) => void;
}

export function renderJob(root: HTMLElement, scope: Scope, params: Params): void {
  const id = Number(params.id);
  let job: Job | null = null;
  let run: PredictionOut | null = null; // the prediction run a job of kind `prediction` places
  const listeners: Listeners = { log: [], checkpoint: [], event: [], state: [], metric: [], timeline: [] };
  const ctx: JobContext = {
    id,
    scope,
    job: () => job,
    on: (kind, fn) => listeners[kind].push(fn),
  };
  const emit = <K extends keyof LiveEvents>(kind: K, data: LiveEvents[K]) => {
    for (const fn of listeners[kind]) fn(data);
  };

  const header = h("div", { class: "job-head" }, h("h1", {}, `Job #${id}`));
  const tabBar = h("nav", { class: "tabs", role: "tablist" });
  const panes = new Map<Tab, HTMLElement>();
  const opened = new Set<Tab>();
  root.append(header, tabBar);

  const chartsHost = h("div", { class: "charts-grid", id: "charts" });
  const charts = new MetricCharts(chartsHost);
  scope.onDispose(() => charts.destroy());
  const chartNote = h("p", { class: "muted chart-note" });

  const build: Record<Tab, (pane: HTMLElement) => void> = {
    charts: (pane) => pane.append(chartNote, chartsHost),
    graph: (pane) => graphTab(pane, ctx),
    pipeline: (pane) => pipelineTab(pane, ctx),
    events: (pane) => eventsTab(pane, ctx),
    logs: (pane) => logsTab(pane, ctx),
    checkpoints: (pane) => checkpointsTab(pane, ctx),
    environment: (pane) => environmentTab(pane, ctx),
    predictions: (pane) => predictionsTab(pane, ctx),
    yaml: (pane) => yamlTab(pane, ctx),
  };

  const select = (tab: Tab) => {
    for (const [name, pane] of panes) pane.hidden = name !== tab;
    for (const button of tabBar.querySelectorAll("button")) {
      button.classList.toggle("active", button.dataset.tab === tab);
      button.setAttribute("aria-selected", String(button.dataset.tab === tab));
    }
    if (!opened.has(tab)) {
      opened.add(tab);
      build[tab](panes.get(tab) as HTMLElement);
    }
    // The tab is part of the address but not a new page: no hashchange, no reload.
    history.replaceState(null, "", `#/jobs/${id}${tab === "charts" ? "" : `/${tab}`}`);
  };
  for (const tab of TABS) {
    const pane = h("div", { class: `tab-pane pane-${tab}`, role: "tabpanel", hidden: true });
    panes.set(tab, pane);
    root.append(pane);
    // Only a pipelined job has a pipeline tab, shown once the job is known to be one.
    tabBar.append(
      h("button", { role: "tab", "data-tab": tab, hidden: tab === "pipeline", onclick: () => select(tab) }, tab),
    );
  }

  // A plain link cannot carry the bearer token: each button fetches its file, then saves it.
  const downloads = (j: Job) => {
    const files: [JobFile, string, string][] = [
      ["metrics.csv", "Metrics CSV", `${j.name}-job${j.id}.csv`],
      ["logs.txt", "Log", `${j.name}-job${j.id}.log`],
      ["tensorboard", "TensorBoard", `${j.name}-job${j.id}-tensorboard.tar`],
    ];
    return h(
      "div",
      { class: "downloads", id: "job-downloads", role: "group", "aria-label": "downloads" },
      ...files.map(([file, label, filename]) => {
        const button = h("button", { "data-file": file, title: `download ${filename}` }, `⤓ ${label}`);
        button.addEventListener("click", async () => {
          button.disabled = true;
          try {
            const link = h("a", { href: URL.createObjectURL(await api.jobFile(j.id, file)), download: filename });
            link.click();
            setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
          } catch (error) {
            alert(`Download failed: ${errorText(error)}`);
          } finally {
            button.disabled = false;
          }
        });
        return button;
      }),
    );
  };

  const drawHeader = (j: Job) => {
    const cancel = h(
      "button",
      {
        class: "danger",
        id: "cancel-job",
        onclick: async () => {
          if (!confirm(`Cancel job #${j.id} (${j.name})?`)) return;
          cancel.disabled = true;
          try {
            job = await api.cancel(j.id);
            drawHeader(job);
          } catch (error) {
            alert(`Cancel failed: ${errorText(error)}`);
            cancel.disabled = false;
          }
        },
      },
      j.cancel_requested ? "Cancelling…" : "Cancel job",
    );
    if (j.cancel_requested) cancel.disabled = true;
    const predicting = scoresRows(j);
    const copy = h(
      "button",
      {
        onclick: () => {
          // the document the job ran: its overrides carried into the copy
          localStorage.setItem(DRAFT_KEY, effectiveYaml(j));
          location.hash = "#/new";
        },
      },
      "Edit a copy",
    );
    fill(
      header,
      h(
        "div",
        { class: "page-head" },
        h("a", { href: "#/jobs", class: "back" }, "← Jobs"),
        h("h1", {}, `#${j.id} ${j.name}`),
        h("span", { id: "job-state" }, stateBadge(j.state)),
        h("div", { class: "spacer" }),
        downloads(j),
        predicting ? null : copy,
        TERMINAL.has(j.state) ? null : cancel,
      ),
      h(
        "div",
        { class: "facts card" },
        predicting && run
          ? h(
              "div",
              { class: "fact wide", id: "rows-scored" },
              h("span", { class: "muted" }, "rows scored"),
              progressBar(run.rows_done, run.rows, j.state),
              h("strong", { class: "num" }, `${run.rows_done.toLocaleString()} / ${run.rows.toLocaleString()} rows`),
            )
          : h(
              "div",
              { class: "fact wide" },
              h("span", { class: "muted" }, "progress"),
              progressBar(j.step, j.train_steps, j.state),
              h("strong", { class: "num" }, `${j.step.toLocaleString()} / ${j.train_steps.toLocaleString()}`),
            ),
        predicting && run ? fact("prediction run", `#${run.id} of ${run.model ?? `job #${run.job_id ?? "?"}`}`) : null,
        predicting && run && run.job_id !== null
          ? fact("source job", h("a", { href: `#/jobs/${run.job_id}`, id: "run-source" }, `#${run.job_id}`))
          : null,
        predicting && run ? fact("dataset", run.dataset) : null,
        fact("owner", j.owner),
        j.sweep_id !== null
          ? fact("sweep", h("a", { href: `#/sweeps/${j.sweep_id}`, id: "job-sweep" }, `#${j.sweep_id} trial ${j.trial_number ?? "?"}`))
          : null,
        predicting ? fact("kind", j.kind) : fact("framework", j.framework),
        fact("priority", String(j.priority)),
        j.queue_position !== null ? fact("queue position", String(j.queue_position)) : null,
        j.restarts > 0 ? fact("restarts", String(j.restarts)) : null,
        predicting ? null : fact(`best ${j.objective}`, bestOf(j)),
        fact("created", formatTime(j.created_at)),
        fact("started", formatTime(j.started_at)),
        fact("ended", formatTime(j.ended_at)),
        fact("duration", formatDuration(j.duration_seconds)),
      ),
      j.state === "QUEUED" && j.pending_reason
        ? h("div", { class: "pending-reason", id: "pending-reason", role: "status" }, `Waiting: ${j.pending_reason}`)
        : null,
      ...(j.warnings ?? []).map((w) => warningBox(w)),
      j.error ? errorBox(j.error) : null,
    );
  };

  const refresh = async () => {
    const fresh = await api.job(id, scope.signal);
    if (scoresRows(fresh)) run = await api.runOfJob(id, scope.signal);
    const changed = !job || job.state !== fresh.state;
    job = fresh;
    drawHeader(fresh);
    if (changed && job) emit("state", undefined);
  };

  // History first from SQL (downsampled by the server), then live points from the stream; live
  // points that arrive while the history loads are kept and merged after it.
  let pending: MetricEvent[] | null = [];
  const appendMetric = (m: MetricEvent) => charts.append(m.step, m.group, m.rank, m.values);
  const loadHistory = async () => {
    const { series } = await api.metrics(id, MAX_POINTS, scope.signal);
    charts.load(series);
    for (const m of pending ?? []) appendMetric(m);
    pending = null;
    chartNote.textContent =
      series.length === 0 && !TERMINAL.has(job?.state ?? "")
        ? "Waiting for the first metrics…"
        : series.length === 0
          ? "This job reported no metrics."
          : "";
  };

  // Only a job that has not ended has anything to stream. A ticket opens the stream once: when
  // the connection drops, the browser's own retry would be refused, so a new ticket reopens it
  // after the last event seen.
  let lastEventId: string | undefined;
  let ended = false;
  let source: EventSource | null = null;
  scope.onDispose(() => {
    ended = true;
    source?.close();
  });
  const follow = async () => {
    if (ended) return;
    let opened: EventSource;
    try {
      opened = new EventSource(await streamUrl(id, lastEventId));
    } catch (error) {
      // The job is gone or the token no longer works: nothing to follow. Else try again.
      const final = error instanceof ApiError && error.status < 500 && error.status !== 429;
      if (!final) window.setTimeout(() => void follow(), 3000);
      return;
    }
    if (ended) {
      opened.close();
      return;
    }
    source = opened;
    const seen = (event: Event) => {
      const last = (event as MessageEvent).lastEventId;
      if (last) lastEventId = last;
    };
    for (const kind of ["metric", "log", "checkpoint", "event", "timeline"]) {
      opened.addEventListener(kind, seen);
    }
    opened.addEventListener("error", () => {
      opened.close();
      if (!ended) window.setTimeout(() => void follow(), 1000);
    });
    opened.addEventListener("metric", (event) => {
      const m = JSON.parse((event as MessageEvent).data) as MetricEvent;
      emit("metric", m);
      if (pending) pending.push(m);
      else {
        appendMetric(m);
        chartNote.textContent = "";
      }
    });
    opened.addEventListener("log", () => emit("log", undefined));
    opened.addEventListener("checkpoint", () => emit("checkpoint", undefined));
    opened.addEventListener("event", () => emit("event", undefined));
    opened.addEventListener("timeline", (event) =>
      emit("timeline", JSON.parse((event as MessageEvent).data) as StageTimeline),
    );
    opened.addEventListener("state", () => void refresh().catch(() => undefined));
    opened.addEventListener("end", () => {
      ended = true;
      opened.close();
      // Reload once: points the ingester stored after the last live event are drawn too.
      void refresh()
        .then(loadHistory)
        .catch(() => undefined);
    });
  };

  refresh()
    .then(() => {
      const pipelined = job !== null && isPipelined(job);
      const predicting = job !== null && scoresRows(job);
      const shown = (tab: Tab) =>
        predicting ? PREDICTION_TABS.includes(tab) : tab !== "pipeline" || pipelined;
      for (const button of tabBar.querySelectorAll<HTMLElement>("button")) {
        button.hidden = !shown(button.dataset.tab as Tab);
      }
      const first = predicting ? PREDICTION_TABS[0] : "charts";
      const wanted = (params.tab ?? first) as Tab;
      select(TABS.includes(wanted) && shown(wanted) ? wanted : first);
      if (job && !TERMINAL.has(job.state)) void follow();
      return loadHistory();
    })
    .catch((error) => fill(header, errorBox(errorText(error))));

  scope.every(REFRESH_MS, async () => {
    if (job && !TERMINAL.has(job.state)) await refresh();
  });
}
