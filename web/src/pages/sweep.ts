// A sweep: its header with state and cancel, the best trial (or the Pareto front), parallel
// coordinates, the metric against step for every trial, parameter importance, PBT schedules and
// the trials table. Polled every 2 s while it runs, as a job's page is; each live trial's
// metric series is read from GET /jobs/{id}/metrics.

import { ApiError, SWEEP_TERMINAL, TERMINAL, type SweepDetail, type Trial, api } from "../api";
import { fill, formatTime, h } from "../dom";
import { type Params, type Scope, errorText } from "../scope";
import { errorBox, fact, progressBar, stateBadge, warningBox } from "../components/widgets";
import { objective } from "./models";
import { objectivesText } from "./sweeps";
import {
  bestPanel,
  curves,
  importance,
  parcoords,
  pareto,
  schedules,
  trialsTable,
} from "./sweeppanels";

const REFRESH_MS = 2000;
const CURVE_POINTS = 400;

/** A trial's series of one metric, and whether it can still change. */
interface Loaded {
  points: [number, number][];
  /** reads since the trial ended: the second one is final (the ingester may lag the state) */
  endedReads: number;
}

export function renderSweep(root: HTMLElement, scope: Scope, params: Params): void {
  const id = Number(params.id);
  let sweep: SweepDetail | null = null;
  let metric = "";
  let loaded = new Map<number, Loaded>();
  let importanceEnded = -1;
  let drawnKey = "";

  const header = h("div", { class: "sweep-head" }, h("h1", {}, `Sweep #${id}`));
  const best = h("section", { class: "card", id: "best-trial" });
  const paretoCard = h("section", { class: "card", id: "pareto", hidden: true });
  const topk = h("input", { type: "range", id: "topk", min: "5", max: "100", step: "5", value: "100" });
  const topkLabel = h("span", { class: "muted num", id: "topk-label" });
  const pcHost = h("div", { class: "chart-host", id: "parcoords" });
  const metricSelect = h("select", { id: "curve-metric", "aria-label": "metric", hidden: true });
  const curvesHost = h("div", { class: "chart-host", id: "trial-curves" });
  const importanceCard = h("section", { class: "card", id: "importance", hidden: true });
  const schedulesCard = h("section", { class: "card", id: "schedules", hidden: true });
  const trialsHost = h("div", { class: "table-wrap", id: "trials" });
  root.append(
    header,
    best,
    registerBest(id),
    paretoCard,
    h(
      "section",
      { class: "card" },
      h(
        "div",
        { class: "card-head" },
        h("h2", {}, "Parallel coordinates"),
        h("div", { class: "spacer" }),
        h("label", { class: "inline", for: "topk" }, "top", topk, topkLabel),
      ),
      pcHost,
    ),
    h(
      "section",
      { class: "card" },
      h(
        "div",
        { class: "card-head" },
        h("h2", {}, "Metric against step"),
        h("span", { class: "muted small" }, "dashed with ✕: pruned at that rung"),
        h("div", { class: "spacer" }),
        metricSelect,
      ),
      curvesHost,
    ),
    importanceCard,
    schedulesCard,
    h("section", { class: "card" }, h("h2", {}, "Trials"), trialsHost),
  );

  const drawParcoords = () => {
    if (!sweep) return;
    const percent = Number(topk.value);
    const { chart, shown, of } = parcoords(sweep, percent);
    fill(pcHost, chart);
    topkLabel.textContent = `${percent}% · ${shown} of ${of} trials`;
  };
  topk.addEventListener("input", drawParcoords);

  const drawCurves = () => {
    if (!sweep) return;
    const series = new Map([...loaded].map(([number, l]) => [number, l.points]));
    fill(curvesHost, curves(sweep, metric, series));
  };
  metricSelect.addEventListener("change", () => {
    metric = metricSelect.value;
    loaded = new Map();
    void loadCurves().catch((error) => fill(curvesHost, errorBox(errorText(error))));
  });

  const drawHeader = (s: SweepDetail) => {
    const cancel = h(
      "button",
      {
        class: "danger",
        id: "cancel-sweep",
        onclick: async () => {
          if (!confirm(`Cancel sweep #${s.id} (${s.name}) and its live trials?`)) return;
          cancel.disabled = true;
          try {
            sweep = await api.cancelSweep(s.id);
            draw();
          } catch (error) {
            alert(`Cancel failed: ${errorText(error)}`);
            cancel.disabled = false;
          }
        },
      },
      s.cancel_requested ? "Cancelling…" : "Cancel sweep",
    );
    if (s.cancel_requested) cancel.disabled = true;
    fill(
      header,
      h(
        "div",
        { class: "page-head" },
        h("a", { href: "#/sweeps", class: "back" }, "← Sweeps"),
        h("h1", {}, `Sweep #${s.id} ${s.name}`),
        h("span", { id: "sweep-state" }, stateBadge(s.state)),
        h("div", { class: "spacer" }),
        SWEEP_TERMINAL.has(s.state) ? null : cancel,
      ),
      h(
        "div",
        { class: "facts card" },
        h(
          "div",
          { class: "fact wide" },
          h("span", { class: "muted" }, "trials ended"),
          progressBar(s.trials_ended, s.trial_count, s.state),
          h("strong", { class: "num", id: "sweep-trials" }, `${s.trials_ended} / ${s.trial_count}`),
        ),
        fact("objective", objectivesText(s)),
        fact("algorithm", s.algorithm),
        fact("pruner", s.pruner),
        fact("started", `${s.trials_created} (${s.max_parallel} at a time)`),
        fact("owner", s.owner),
        fact("created", formatTime(s.created_at)),
        fact("ended", formatTime(s.ended_at)),
      ),
      h("div", { id: "sweep-warnings" }, ...s.warnings.map((w) => warningBox(w))),
      s.error ? errorBox(s.error) : null,
    );
  };

  const draw = () => {
    if (!sweep) return;
    drawHeader(sweep);
    bestPanel(best, sweep);
    const front = pareto(sweep);
    paretoCard.hidden = front === null;
    if (front) fill(paretoCard, h("h2", {}, "Objectives"), front);
    drawParcoords();
    const learned = schedules(sweep);
    schedulesCard.hidden = learned === null;
    if (learned) fill(schedulesCard, h("h2", {}, "PBT schedules"), h("div", { class: "schedule-grid" }, ...learned));
    fill(trialsHost, trialsTable(sweep));
  };

  // Each trial's series: read again while its job runs, twice after it ended, then kept.
  const loadCurves = async () => {
    if (!sweep) return;
    const wanted = metric;
    const reads = sweep.trials
      .filter((t) => t.state !== "QUEUED" && (loaded.get(t.number)?.endedReads ?? 0) < 2)
      .map(async (t: Trial) => {
        const { series } = await api.metrics(t.job_id, CURVE_POINTS, scope.signal, [wanted]);
        const chosen = series.find((s) => s.group === 0 && s.rank === 0) ?? series[0];
        const points = (chosen?.points ?? []).filter((p): p is [number, number] => p[1] !== null);
        const before = loaded.get(t.number)?.endedReads ?? 0;
        return { number: t.number, points, endedReads: TERMINAL.has(t.state) ? before + 1 : 0 };
      });
    const results = await Promise.all(reads);
    if (wanted !== metric) return;
    for (const r of results) loaded.set(r.number, { points: r.points, endedReads: r.endedReads });
    drawCurves();
  };

  // Importance is asked for again whenever more trials have ended; a 4xx (too few trials, or
  // a server without it) hides the panel.
  const loadImportance = async () => {
    if (!sweep || sweep.trials_ended === importanceEnded) return;
    importanceEnded = sweep.trials_ended;
    try {
      const result = await api.importance(id, scope.signal);
      if (Object.keys(result.importances).length === 0) throw new ApiError(404, "no importances");
      fill(importanceCard, h("h2", {}, "Parameter importance"), ...importance(result));
      importanceCard.hidden = false;
    } catch (error) {
      if (!(error instanceof ApiError) || error.status >= 500) throw error;
      importanceCard.hidden = true;
    }
  };

  const refresh = async () => {
    const fresh = await api.sweep(id, scope.signal);
    sweep = fresh;
    if (!metric) {
      metric = fresh.objectives[0].metric;
      fill(metricSelect, ...fresh.objectives.map((o) => h("option", { value: o.metric }, o.metric)));
      metricSelect.hidden = fresh.objectives.length < 2;
    }
    // Redraw only what changed: the SVGs are rebuilt whole.
    const key = JSON.stringify(fresh);
    if (key !== drawnKey) {
      drawnKey = key;
      draw();
    }
    await Promise.all([loadCurves(), loadImportance()]);
  };

  const onError = (error: unknown) => {
    drawnKey = "";
    if (sweep) fill(trialsHost, errorBox(errorText(error)));
    else fill(header, errorBox(errorText(error)));
  };
  scope.every(
    REFRESH_MS,
    async () => {
      const settled = sweep && SWEEP_TERMINAL.has(sweep.state) && [...loaded.values()].every((l) => l.endedReads >= 2);
      if (!settled) await refresh();
    },
    onError,
  );
}


/** A form that registers the sweep's best trial's checkpoint as the next version of a model. */
function registerBest(id: number): HTMLElement {
  const name = h("input", { id: "register-best-name", placeholder: "model name", required: true });
  const message = h("span", { class: "muted", id: "register-best-message" });
  const form = h(
    "form",
    {
      class: "register-best",
      onsubmit: async (event: Event) => {
        event.preventDefault();
        try {
          const best = (await api.sweep(id)).best;
          if (!best) {
            fill(message, "no best trial yet");
            return;
          }
          const version = await api.registerModel(name.value.trim(), best.job_id, null);
          // the trial's best checkpoint: which step, and the objective's value there
          fill(
            message,
            h("a", { href: "#/models" }, `registered ${version.ref}`),
            `: trial ${best.number}, job #${best.job_id} step ${version.step}, ${objective(version)}`,
          );
        } catch (error) {
          fill(message, errorText(error));
        }
      },
    },
    name,
    h("button", { type: "submit", id: "register-best" }, "Register best trial"),
    message,
  );
  return h("section", { class: "card", id: "register-best-card" }, form);
}
