// Compare: several jobs side by side (#/compare/1,2,3, the ids in the address so the page can be
// shared): one chart per metric with a curve per job, by step or by wall time from each job's
// first point; each metric's final, lowest and highest value; the settings the jobs differ in
// (their documents flattened); and their environments, the facts and packages that differ.
// While a job runs, the page reads them again every 5 s.

import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

import { type Comparison, type CompareCurve, type Job, TERMINAL, api } from "../api";
import { fill, formatValue, h } from "../dom";
import type { Params, Scope } from "../scope";
import { errorText } from "../scope";
import { atStep, hoverValue } from "../components/charts";
import { errorBox, section, stateBadge, table } from "../components/widgets";
import { bestOf, metricValue } from "./jobs";

const COLOURS = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#db2777", "#ca8a04", "#475569", "#dc2626", "#65a30d"];
type Axis = "step" | "time";
const REFRESH_MS = 5000;

export function parseIds(text: string | undefined): number[] {
  return [...new Set((text ?? "").split(",").map((part) => Number(part.trim())))].filter(
    (id) => Number.isInteger(id) && id > 0,
  );
}

export function compareHref(ids: number[]): string {
  return `#/compare/${ids.join(",")}`;
}

function jobLabel(job: Job, index: number): HTMLElement {
  return h(
    "a",
    { href: `#/jobs/${job.id}`, class: "compare-job", style: `border-color: ${COLOURS[index % COLOURS.length]}` },
    `#${job.id} ${job.name}`,
  );
}

function showValue(value: unknown): string {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") return formatValue(value);
  if (typeof value === "string") return value;
  return JSON.stringify(value);
}

/** A fact of an environment: long hashes cut (the full one in the job's environment tab). */
function showFact(key: string, value: unknown): Node | string {
  if (value === null || value === undefined) return "—";
  if (value === "") return "none";
  if (Array.isArray(value)) return value.join(", ");
  if (key === "packages_hash" || key === "trainyard_commit") {
    return h("span", { title: String(value) }, String(value).slice(0, 12));
  }
  return showValue(value);
}

/** A table with a row per key and a column per job. */
function byJob<T>(
  jobs: Job[],
  rows: T[],
  key: (row: T) => string,
  cell: (row: T, index: number) => Node | string,
  empty: string,
  attrs?: (row: T) => Record<string, string>,
): HTMLTableElement {
  return table(
    [
      { title: "", cell: (row: T) => h("code", {}, key(row)) },
      ...jobs.map((job, i) => ({
        title: `#${job.id}`,
        cell: (row: T) => cell(row, i),
        className: "num",
      })),
    ],
    rows,
    { empty, rowAttrs: attrs },
  );
}

class CurvePanels {
  private plots: uPlot[] = [];
  private readonly resize: ResizeObserver;

  constructor(private readonly host: HTMLElement) {
    this.resize = new ResizeObserver(() => {
      for (const plot of this.plots) plot.setSize(this.size());
    });
    this.resize.observe(host);
  }

  draw(jobs: Job[], curves: CompareCurve[], axis: Axis): void {
    this.destroyPlots();
    const names = [...new Set(curves.map((c) => c.name))].sort();
    const starts = new Map<number, number>();
    for (const c of curves) {
      const first = c.times[0];
      if (first !== undefined) starts.set(c.job_id, Math.min(starts.get(c.job_id) ?? first, first));
    }
    const figures: HTMLElement[] = [];
    for (const name of names) {
      const lines = jobs
        .map((job, index) => ({ job, index, curve: curves.find((c) => c.job_id === job.id && c.name === name) }))
        .filter((l): l is { job: Job; index: number; curve: CompareCurve } => l.curve !== undefined);
      const xy = lines.map(({ curve }) => {
        const points = curve.values
          .map((v, i) => [axis === "step" ? curve.steps[i] : curve.times[i] - (starts.get(curve.job_id) ?? 0), v] as const)
          .filter((p): p is readonly [number, number] => p[1] !== null);
        // uPlot.join wants each x series ascending and unique.
        const xs: number[] = [];
        const ys: number[] = [];
        for (const [x, y] of points) {
          if (xs.length && x <= xs[xs.length - 1]) continue;
          xs.push(x);
          ys.push(y);
        }
        return [xs, ys] as uPlot.AlignedData;
      });
      const plotHost = h("div", { class: "chart-plot" });
      const figure = h(
        "figure",
        { class: "chart", "data-metric": name, "data-curves": String(lines.length) },
        h("figcaption", {}, h("strong", {}, name)),
        plotHost,
      );
      figures.push(figure);
      this.host.append(figure);
      const plot = new uPlot(
        {
          ...this.size(),
          scales: { x: { time: false } },
          axes: [
            { label: axis === "step" ? "step" : "seconds from the job's first point", labelSize: 16, size: 36 },
            { size: 56, values: (_u, ticks) => ticks.map((t) => formatValue(t)) },
          ],
          legend: { live: true },
          cursor: { drag: { x: true, y: false } },
          series: [
            { label: axis },
            ...lines.map(({ job, index }) => ({
              label: `#${job.id} ${job.name}`,
              stroke: COLOURS[index % COLOURS.length],
              width: 1.5,
              spanGaps: true,
              value: hoverValue(axis === "step" ? atStep : (seconds) => `at ${formatValue(seconds)} s`),
            })),
          ],
        },
        uPlot.join(xy),
        plotHost,
      );
      this.plots.push(plot);
    }
    fill(this.host, ...(figures.length ? figures : [h("p", { class: "muted" }, "No metrics reported yet.")]));
  }

  destroy(): void {
    this.resize.disconnect();
    this.destroyPlots();
  }

  private destroyPlots(): void {
    for (const plot of this.plots) plot.destroy();
    this.plots = [];
    this.host.replaceChildren();
  }

  private size(): { width: number; height: number } {
    const width = this.host.clientWidth;
    return { width: Math.max(width > 900 ? width / 2 - 24 : width - 16, 260), height: 220 };
  }
}

export function renderCompare(root: HTMLElement, scope: Scope, params: Params): void {
  const ids = parseIds(params.ids);
  let axis: Axis = "step";
  let found: Comparison | null = null;
  const title = h("h1", {}, `Compare ${ids.map((id) => `#${id}`).join(", ")}`);
  const jobsRow = h("div", { class: "compare-jobs" });
  const axisButtons = (["step", "time"] as Axis[]).map((which) =>
    h(
      "button",
      {
        class: `chip ${which === axis ? "active" : ""}`,
        "data-axis": which,
        onclick: () => {
          axis = which;
          for (const b of axisButtons) b.classList.toggle("active", b.dataset.axis === axis);
          if (found) panels.draw(found.jobs, found.curves, axis);
        },
      },
      which === "step" ? "by step" : "by wall time",
    ),
  );
  const chartsHost = h("div", { class: "charts-grid", id: "compare-charts" });
  const panels = new CurvePanels(chartsHost);
  scope.onDispose(() => panels.destroy());
  const metricsHost = h("div", { class: "table-wrap", id: "compare-metrics" });
  const settingsHost = h("div", { class: "table-wrap", id: "compare-settings" });
  const envHost = h("div", { class: "table-wrap", id: "compare-environment" });
  const status = h("div", {});
  root.append(
    h("div", { class: "page-head" }, title),
    status,
    jobsRow,
    h("div", { class: "toolbar" }, h("div", { class: "chips" }, ...axisButtons)),
    chartsHost,
    section("Metrics: final (lowest – highest)", metricsHost),
    section("Settings that differ", settingsHost),
    section("Environments", envHost),
  );

  const draw = (c: Comparison) => {
    fill(
      jobsRow,
      ...c.jobs.map((job, i) =>
        h("span", { class: "compare-head", "data-job": String(job.id) }, jobLabel(job, i), " ", stateBadge(job.state), " ", bestOf(job)),
      ),
    );
    panels.draw(c.jobs, c.curves, axis);
    fill(
      metricsHost,
      byJob(
        c.jobs,
        c.metrics,
        (m) => m.name,
        (m, i) =>
          h(
            "span",
            {},
            h("strong", {}, metricValue(m.name, m.final[i])),
            h("span", { class: "muted small" }, ` (${metricValue(m.name, m.min[i])} – ${metricValue(m.name, m.max[i])})`),
          ),
        "No metrics reported yet.",
        (m) => ({ "data-metric": m.name }),
      ),
    );
    fill(
      settingsHost,
      h("p", { class: "muted" }, `${c.settings.length} settings differ; ${c.same_settings} are the same in every job.`),
      byJob(c.jobs, c.settings, (d) => d.key, (d, i) => showValue(d.values[i]), "The jobs' settings are the same.", (d) => ({
        "data-key": d.key,
      })),
    );
    const facts = Object.keys(c.environments.find((e) => e) ?? {});
    const differing = new Set(c.environment.map((d) => d.key));
    fill(
      envHost,
      c.environments.every((e) => e === null)
        ? h("p", { class: "muted" }, "No job has reported its environment yet.")
        : byJob(
            c.jobs,
            facts,
            (key) => key,
            (key, i) => showFact(key, c.environments[i]?.[key] ?? null),
            "",
            (key): Record<string, string> =>
              differing.has(key) ? { "data-key": key, class: "differs" } : { "data-key": key },
          ),
      h("h3", {}, `Packages that differ (${c.packages.length})`),
      byJob(c.jobs, c.packages, (d) => d.key, (d, i) => showValue(d.values[i]), "The same packages everywhere.", (d) => ({
        "data-package": d.key,
      })),
    );
  };

  if (ids.length < 2) {
    status.append(errorBox("Pick at least two jobs to compare: select them in the jobs list."));
    return;
  }
  // Read again every few seconds while a job is still live; once all have ended, never.
  scope.every(
    REFRESH_MS,
    async () => {
      if (found && found.jobs.every((job) => TERMINAL.has(job.state))) return;
      found = await api.compare(ids, scope.signal);
      fill(status);
      draw(found);
    },
    (error) => fill(status, errorBox(errorText(error))),
  );
}
