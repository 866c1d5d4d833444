// The sweep page's panels, each drawn from the latest GET /sweeps/{id}: the best trial, the
// trials table, parallel coordinates with the top-k% filter, the metric against step, the Pareto
// front, parameter importance and population-based training's schedules.

import { type SweepDetail, type SweepImportance, type Trial } from "../api";
import { fill, formatValue, h } from "../dom";
import { drawParcoords, type PcAxis, type PcLine, shortName } from "../components/parcoords";
import { TRIAL_COLOURS, category, scaleFor } from "../components/scales";
import {
  type Curve,
  drawCurves,
  drawImportance,
  drawPareto,
  drawSchedule,
  type ScheduleLine,
} from "../components/sweepcharts";
import { type Column, fact, stateBadge, table } from "../components/widgets";

export function trialColour(trial: number): string {
  return TRIAL_COLOURS[trial % TRIAL_COLOURS.length];
}

/** The searched paths in the order the space lists them (then any only the trials name). */
export function paramPaths(sweep: SweepDetail): string[] {
  const paths = Object.keys(space(sweep));
  for (const trial of sweep.trials) {
    for (const path of Object.keys(trial.params)) if (!paths.includes(path)) paths.push(path);
  }
  return paths;
}

function space(sweep: SweepDetail): Record<string, Record<string, unknown>> {
  const entries = sweep.search.space;
  return entries && typeof entries === "object" ? (entries as Record<string, Record<string, unknown>>) : {};
}

function showParam(value: unknown): string {
  return typeof value === "number" ? formatValue(value) : category(value);
}

/** A trial's value of objective `k` (the single objective's latest value while it runs). */
export function objectiveValue(trial: Trial, k: number): number | null {
  const value = trial.values?.[k] ?? (k === 0 ? trial.value : null);
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

function onFront(sweep: SweepDetail): Set<number> {
  return new Set(sweep.pareto_front.map((t) => t.number));
}

export function bestPanel(host: HTMLElement, sweep: SweepDetail): void {
  if (sweep.objectives.length > 1) {
    const front = sweep.pareto_front;
    fill(
      host,
      h("h2", {}, "Pareto front"),
      front.length === 0
        ? h("p", { class: "muted" }, "No trial has reported every objective yet.")
        : h(
            "p",
            {},
            `${front.length} trial${front.length === 1 ? "" : "s"} no other trial beats on every objective: `,
            ...front.flatMap((t, i) => [i ? ", " : "", h("a", { href: `#/jobs/${t.job_id}` }, `trial ${t.number}`)]),
          ),
    );
    return;
  }
  const best = sweep.best;
  if (!best) {
    fill(host, h("h2", {}, "Best trial"), h("p", { class: "muted" }, "No trial has a result yet."));
    return;
  }
  const metric = sweep.objectives[0];
  fill(
    host,
    h("h2", {}, "Best trial"),
    h(
      "div",
      { class: "facts" },
      fact("trial", h("span", { id: "best-number" }, String(best.number))),
      fact(`${metric.metric} (${metric.mode})`, h("span", { id: "best-value" }, formatValue(best.value))),
      sweep.best_test
        ? fact(
            `${sweep.best_test.metric} (honest estimate)`,
            h(
              "span",
              { id: "best-test", title: "the chosen trial on the test split, which the choice never saw" },
              formatValue(sweep.best_test.value),
            ),
          )
        : null,
      fact("job", h("a", { href: `#/jobs/${best.job_id}`, id: "best-job" }, `#${best.job_id} ${sweep.best_job?.name ?? ""}`)),
      fact("state", stateBadge(best.state)),
      fact("steps", `${best.step.toLocaleString()} / ${best.train_steps.toLocaleString()}`),
    ),
    table(
      [
        { title: "parameter", cell: ([path]) => h("code", {}, path) },
        { title: "value", cell: ([, value]) => showParam(value), className: "num" },
      ],
      Object.entries(best.params),
      { rowAttrs: ([path]) => ({ "data-param": path }) },
    ),
  );
}

export function trialsTable(sweep: SweepDetail): HTMLTableElement {
  const front = onFront(sweep);
  const multi = sweep.objectives.length > 1;
  const star = (t: Trial) => (multi ? front.has(t.number) : sweep.best_trial === t.number);
  const columns: Column<Trial>[] = [
    { title: "Trial", cell: (t) => `${t.number}${star(t) ? " ★" : ""}`, className: "num" },
    { title: "Job", cell: (t) => h("a", { href: `#/jobs/${t.job_id}` }, `#${t.job_id}`), className: "num" },
    { title: "State", cell: (t) => stateBadge(t.state) },
    { title: "Step", cell: (t) => `${t.step.toLocaleString()} / ${t.train_steps.toLocaleString()}`, className: "num" },
    { title: "Rung", cell: (t) => (t.pruned_step === null ? "—" : String(t.pruned_step)), className: "num rung" },
    ...paramPaths(sweep).map(
      (path): Column<Trial> => ({
        title: shortName(path),
        cell: (t) => (path in t.params ? showParam(t.params[path]) : "—"),
        className: "num param",
      }),
    ),
    ...sweep.objectives.map(
      (o, k): Column<Trial> => ({
        title: o.metric,
        cell: (t) => formatValue(objectiveValue(t, k)),
        className: "num metric",
      }),
    ),
  ];
  const built = table(columns, sweep.trials, {
    empty: "No trial has started yet.",
    rowAttrs: (t) => ({ "data-trial": String(t.number), class: star(t) ? "best" : "" }),
  });
  // Headers name the whole path on hover.
  const headers = built.querySelectorAll("th");
  paramPaths(sweep).forEach((path, i) => headers[5 + i]?.setAttribute("title", path));
  return built;
}

/** The trials that have a value of every objective, best first by the first objective. */
function ranked(sweep: SweepDetail): Trial[] {
  const sign = sweep.objectives[0].mode === "max" ? -1 : 1;
  return sweep.trials
    .filter((t) => sweep.objectives.every((_, i) => objectiveValue(t, i) !== null))
    .sort((a, b) => sign * ((objectiveValue(a, 0) as number) - (objectiveValue(b, 0) as number)));
}

/** How many of `n` trials the top `percent`% keeps (at least one). */
export function topCount(n: number, percent: number): number {
  return n === 0 ? 0 : Math.max(1, Math.ceil((n * percent) / 100));
}

export function parcoords(sweep: SweepDetail, percent: number): { chart: Node; shown: number; of: number } {
  const all = ranked(sweep);
  if (all.length === 0) {
    return { chart: h("p", { class: "muted" }, "No trial has reported the metric yet."), shown: 0, of: 0 };
  }
  const kept = all.slice(0, topCount(all.length, percent));
  const paths = paramPaths(sweep);
  const entries = space(sweep);
  // The axes span every trial, so filtering does not move them.
  const axes: PcAxis[] = [
    ...paths.map((path) => ({
      key: path,
      scale: scaleFor(all.filter((t) => path in t.params).map((t) => t.params[path]), entries[path]),
      metric: false,
    })),
    ...sweep.objectives.map((o, k) => ({
      key: o.metric,
      scale: scaleFor(all.map((t) => objectiveValue(t, k))),
      metric: true,
    })),
  ];
  const lines: PcLine[] = kept.map((t, rank) => ({
    trial: t.number,
    values: [...paths.map((p) => t.params[p]), ...sweep.objectives.map((_, k) => objectiveValue(t, k))],
    // Rank among all trials, so a trial keeps its colour when the filter changes.
    goodness: all.length === 1 ? 1 : 1 - all.indexOf(t) / (all.length - 1),
    pruned: t.state === "PRUNED",
    best: rank === 0,
  }));
  return { chart: drawParcoords(axes, lines), shown: lines.length, of: all.length };
}

/** `series` holds each trial's [step, value] points of `metric`, by trial number. */
export function curves(sweep: SweepDetail, metric: string, series: Map<number, [number, number][]>): Node {
  const drawn: Curve[] = sweep.trials
    .filter((t) => (series.get(t.number)?.length ?? 0) > 0)
    .map((t) => ({
      trial: t.number,
      points: series.get(t.number) ?? [],
      colour: trialColour(t.number),
      prunedStep: t.state === "PRUNED" ? (t.pruned_step ?? t.step) : null,
      best: sweep.best_trial === t.number,
    }));
  if (drawn.length === 0) return h("p", { class: "muted" }, `No trial has reported ${metric} yet.`);
  const lastStep = Math.max(...sweep.trials.map((t) => t.train_steps));
  const legend = h(
    "div",
    { class: "legend trial-legend" },
    ...drawn.map((c) =>
      h(
        "span",
        { class: `key${c.best ? " best" : ""}`, style: `--key: ${c.colour}`, "data-trial": String(c.trial) },
        `trial ${c.trial}${c.prunedStep !== null ? " ✕" : ""}`,
      ),
    ),
  );
  return h("div", {}, drawCurves(drawn, metric, lastStep), legend);
}

/** The first two objectives against each other; null for a sweep of one objective. */
export function pareto(sweep: SweepDetail): Node | null {
  if (sweep.objectives.length < 2) return null;
  const front = onFront(sweep);
  const points = sweep.trials
    .filter((t) => objectiveValue(t, 0) !== null && objectiveValue(t, 1) !== null && t.values)
    .map((t) => ({
      trial: t.number,
      x: objectiveValue(t, 0) as number,
      y: objectiveValue(t, 1) as number,
      front: front.has(t.number),
    }));
  if (points.length === 0) return h("p", { class: "muted" }, "No trial has reported every objective yet.");
  const [a, b] = sweep.objectives;
  return drawPareto(points, `${a.metric} (${a.mode})`, `${b.metric} (${b.mode})`);
}

export function importance(result: SweepImportance): Node[] {
  return [
    h(
      "p",
      { class: "muted" },
      `How much each parameter explains of ${result.metric}, by Optuna's ${result.evaluator} over ${result.trials} trials.`,
    ),
    drawImportance(result.importances),
  ];
}

/** PBT: each searched path's values over steps, per trial; null when no trial has a schedule. */
export function schedules(sweep: SweepDetail): Node[] | null {
  const all: Trial[] = sweep.trials;
  const trials = all.filter((t) => (t.schedule?.length ?? 0) > 0);
  if (trials.length === 0) return null;
  const entries = space(sweep);
  const lastStep = Math.max(...sweep.trials.map((t) => t.train_steps));
  return paramPaths(sweep).map((path) => {
    const lines: ScheduleLine[] = trials.map((t) => {
      // Drawn up to the step the trial has reached, where its line ends.
      const sorted = [...(t.schedule ?? [])].sort((a, b) => a.step - b.step);
      const schedule = sorted.filter((e, i) => i === 0 || e.step <= t.step);
      return {
        trial: t.number,
        colour: trialColour(t.number),
        steps: schedule.filter((e) => path in e.params).map((e) => [e.step, e.params[path]]),
        exploits: schedule
          .filter((e) => e.from_trial !== null)
          .map((e) => ({ step: e.step, from: e.from_trial as number })),
        until: t.step,
      };
    });
    const values = lines.flatMap((l) => l.steps.map(([, v]) => v));
    return h(
      "figure",
      { class: "schedule-chart", "data-param": path },
      h("figcaption", {}, h("code", {}, path)),
      drawSchedule(path, scaleFor(values, entries[path]), lines, lastStep),
    );
  });
}
