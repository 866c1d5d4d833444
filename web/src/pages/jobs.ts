// Jobs: one server-side page at a time (cursor paging), filtered by state and name, refreshed
// every 2 s. The browser never holds more than one page, so 10,000 jobs cost what 50 do. Jobs
// ticked on any page (kept while paging and filtering) open side by side in Compare.

import { JOB_STATES, type Job, api } from "../api";
import { debounce, fill, formatDuration, formatTime, formatValue, h } from "../dom";
import { type Scope, errorText } from "../scope";
import { type Column, errorBox, progressBar, stateBadge, table } from "../components/widgets";

const PAGE_SIZE = 50;
const REFRESH_MS = 2000;

// Filters and the jobs ticked for comparing survive a visit to a job and back.
const filters = { state: "", name: "" };
const picked = new Set<number>();
const MAX_COMPARE = 10; // as GET /compare allows

export function percent(value: number | null): string {
  return value === null ? "—" : `${(value * 100).toFixed(2)}%`;
}

/** A value of a metric as it reads best: accuracies as percentages, the rest as numbers. */
export function metricValue(metric: string, value: number | null): string {
  return metric.endsWith("accuracy") ? percent(value) : formatValue(value);
}

/** The job's best value of its objective, the objective's name and the step of that value. */
export function bestOf(j: Job): HTMLElement {
  return h(
    "span",
    { class: "best", title: `${j.objective} (${j.objective_mode})` },
    h("span", { class: "best-value" }, metricValue(j.objective, j.best_metric)),
    " ",
    h("span", { class: "muted small best-metric" }, j.objective),
    j.best_step !== null ? h("span", { class: "muted small" }, ` @${j.best_step.toLocaleString()}`) : null,
  );
}

const COLUMNS: Column<Job>[] = [
  {
    title: "",
    cell: (j) =>
      h("input", {
        type: "checkbox",
        class: "pick",
        "data-pick": String(j.id),
        "aria-label": `compare job ${j.id}`,
        checked: picked.has(j.id),
      }),
    className: "pick-cell",
  },
  { title: "#", cell: (j) => String(j.id), className: "num id" },
  { title: "State", cell: (j) => stateBadge(j.state) },
  { title: "Name", cell: (j) => h("a", { href: `#/jobs/${j.id}`, class: "job-name" }, j.name) },
  { title: "Owner", cell: (j) => j.owner },
  // A prediction run has no framework: its kind says what it is.
  { title: "Framework", cell: (j) => j.framework || h("span", { class: "muted" }, j.kind) },
  {
    title: "Progress",
    cell: (j) =>
      h(
        "div",
        { class: "progress-cell" },
        // progress: the server's, a training run's steps or a prediction run's rows
        progressBar(j.progress, 1, j.state),
        h(
          "span",
          { class: "num" },
          j.train_steps > 0
            ? `${j.step.toLocaleString()} / ${j.train_steps.toLocaleString()}`
            : `${Math.round(j.progress * 100)}%`,
        ),
      ),
  },
  { title: "Best (objective)", cell: bestOf, className: "num" },
  { title: "Start", cell: (j) => formatTime(j.started_at), className: "num" },
  { title: "End", cell: (j) => formatTime(j.ended_at), className: "num" },
  { title: "Duration", cell: (j) => formatDuration(j.duration_seconds), className: "num" },
];

export function renderJobs(root: HTMLElement, scope: Scope): void {
  // cursors[i] opens page i; page 0 is the newest jobs.
  let cursors: (string | null)[] = [null];
  let nextCursor: string | null = null;

  const stateButtons = ["", ...JOB_STATES].map((state) =>
    h(
      "button",
      {
        class: `chip ${state ? `state-${state.toLowerCase()}` : ""}`,
        "data-state": state || "all",
        onclick: () => {
          filters.state = state;
          restart();
        },
      },
      state ? state.toLowerCase() : "all",
    ),
  );
  const nameInput = h("input", {
    type: "search",
    id: "job-filter-name",
    placeholder: "filter by name",
    value: filters.name,
  });
  nameInput.addEventListener(
    "input",
    debounce(() => {
      filters.name = nameInput.value.trim();
      restart();
    }, 300),
  );
  const older = h("button", { onclick: () => move(1) }, "Older →");
  const newer = h("button", { onclick: () => move(-1) }, "← Newer");
  const pageLabel = h("span", { class: "muted" });
  const status = h("span", { class: "muted live" });
  const body = h("div", { class: "table-wrap" });
  const compareButton = h("button", {
    id: "compare-picked",
    onclick: () => {
      location.hash = `#/compare/${[...picked].sort((a, b) => a - b).join(",")}`;
    },
  });
  const clearButton = h("button", {
    class: "link",
    onclick: () => {
      picked.clear();
      for (const box of body.querySelectorAll<HTMLInputElement>("input[data-pick]")) box.checked = false;
      showPicked();
    },
  }, "clear");
  const showPicked = () => {
    compareButton.textContent = `Compare (${picked.size})`;
    compareButton.disabled = picked.size < 2;
    compareButton.title = picked.size < 2 ? "tick two jobs or more" : "";
    clearButton.hidden = picked.size === 0;
  };
  showPicked();

  root.append(
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, "Jobs"),
      h("div", { class: "spacer" }),
      h("a", { class: "button primary", href: "#/new" }, "New job"),
    ),
    h(
      "div",
      { class: "toolbar" },
      h("div", { class: "chips" }, ...stateButtons),
      nameInput,
      h("div", { class: "spacer" }),
      clearButton,
      compareButton,
      status,
    ),
    body,
    h("div", { class: "pager" }, newer, pageLabel, older),
  );

  const load = async () => {
    const page = await api.jobs(
      {
        state: filters.state || undefined,
        name: filters.name || undefined,
        limit: PAGE_SIZE,
        cursor: cursors[cursors.length - 1],
      },
      scope.signal,
    );
    nextCursor = page.next_cursor;
    const empty = filters.state || filters.name ? "No job matches these filters." : "No jobs yet.";
    fill(body, table(COLUMNS, page.items, { empty, rowAttrs: (j) => ({ "data-job": String(j.id) }) }));
    older.disabled = !nextCursor;
    newer.disabled = cursors.length === 1;
    pageLabel.textContent = `page ${cursors.length}`;
    status.textContent = `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
    for (const button of stateButtons) {
      button.classList.toggle("active", button.dataset.state === (filters.state || "all"));
    }
  };
  const onError = (error: unknown) => fill(body, errorBox(errorText(error)));

  const move = (delta: number) => {
    if (delta > 0 && nextCursor) cursors.push(nextCursor);
    if (delta < 0 && cursors.length > 1) cursors.pop();
    load().catch(onError);
  };
  const restart = () => {
    cursors = [null];
    load().catch(onError);
  };

  body.addEventListener("click", (event) => {
    const target = event.target as HTMLElement;
    if (target instanceof HTMLInputElement && target.dataset.pick) {
      const id = Number(target.dataset.pick);
      if (target.checked && picked.size >= MAX_COMPARE) target.checked = false;
      else if (target.checked) picked.add(id);
      else picked.delete(id);
      showPicked();
      return;
    }
    if (target.closest(".pick-cell")) return;
    const row = target.closest("tr[data-job]") as HTMLElement | null;
    if (row && !target.closest("a")) location.hash = `#/jobs/${row.dataset.job}`;
  });
  scope.every(REFRESH_MS, load, onError);
}
