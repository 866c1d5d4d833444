// Sweeps: newest first, one page of 50 at a time (older pages by `before`), refreshed every 2 s:
// state, trials ended of the total, the best value so far.

import { type SweepOut, api } from "../api";
import { fill, formatTime, formatValue, h } from "../dom";
import { type Scope, errorText } from "../scope";
import { type Column, errorBox, progressBar, stateBadge, table } from "../components/widgets";

const PAGE_SIZE = 50;
const REFRESH_MS = 2000;

/** "test/accuracy (max)", or the objectives joined for a multi-objective sweep. */
export function objectivesText(sweep: SweepOut): string {
  return sweep.objectives.map((o) => `${o.metric} (${o.mode})`).join(", ");
}

const COLUMNS: Column<SweepOut>[] = [
  { title: "#", cell: (s) => String(s.id), className: "num id" },
  { title: "State", cell: (s) => stateBadge(s.state) },
  { title: "Name", cell: (s) => h("a", { href: `#/sweeps/${s.id}`, class: "job-name" }, s.name) },
  { title: "Owner", cell: (s) => s.owner },
  { title: "Search", cell: (s) => `${s.algorithm}${s.pruner === "none" ? "" : ` · ${s.pruner}`}` },
  {
    title: "Trials",
    cell: (s) =>
      h(
        "div",
        { class: "progress-cell" },
        progressBar(s.trials_ended, s.trial_count, s.state),
        h("span", { class: "num trials-done" }, `${s.trials_ended} / ${s.trial_count}`),
      ),
  },
  { title: "Objective", cell: (s) => objectivesText(s) },
  {
    title: "Best",
    cell: (s) =>
      s.objectives.length > 1
        ? "Pareto front"
        : s.best_trial === null
          ? "—"
          : `${formatValue(s.best_value)} (trial ${s.best_trial})`,
    className: "num best-value",
  },
  { title: "Created", cell: (s) => formatTime(s.created_at), className: "num" },
  { title: "Ended", cell: (s) => formatTime(s.ended_at), className: "num" },
];

export function renderSweeps(root: HTMLElement, scope: Scope): void {
  // befores[i] opens page i; page 0 is the newest sweeps.
  const befores: (number | null)[] = [null];
  let next: number | null = null;
  const older = h("button", { onclick: () => move(1) }, "Older →");
  const newer = h("button", { onclick: () => move(-1) }, "← Newer");
  const status = h("span", { class: "muted live" });
  const body = h("div", { class: "table-wrap", id: "sweeps" });
  root.append(
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, "Sweeps"),
      h("div", { class: "spacer" }),
      status,
      h("a", { class: "button primary", href: "#/new", title: "a job with a search section is a sweep" }, "New sweep"),
    ),
    body,
    h("div", { class: "pager" }, newer, older),
  );

  const load = async () => {
    const page = await api.sweeps({ limit: PAGE_SIZE, before: befores[befores.length - 1] }, scope.signal);
    next = page.next_before;
    const empty = "No sweeps yet: a job with a search section is a sweep (New sweep).";
    fill(body, table(COLUMNS, page.items, { empty, rowAttrs: (s) => ({ "data-sweep": String(s.id) }) }));
    older.disabled = next === null;
    newer.disabled = befores.length === 1;
    status.textContent = `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
  };
  const onError = (error: unknown) => fill(body, errorBox(errorText(error)));
  const move = (delta: number) => {
    if (delta > 0 && next !== null) befores.push(next);
    if (delta < 0 && befores.length > 1) befores.pop();
    load().catch(onError);
  };
  body.addEventListener("click", (event) => {
    const target = event.target as HTMLElement;
    const row = target.closest("tr[data-sweep]") as HTMLElement | null;
    if (row && !target.closest("a")) location.hash = `#/sweeps/${row.dataset.sweep}`;
  });
  scope.every(REFRESH_MS, load, onError);
}
