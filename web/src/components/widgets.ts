// Small pieces every page uses: state badges, progress bars, tables, tabs.

import { h } from "../dom";

export function stateBadge(state: string): HTMLElement {
  return h("span", { class: `badge state-${state.toLowerCase()}` }, state.toLowerCase());
}

/** A labelled value in a `facts` row. */
export function fact(label: string, value: Node | string): HTMLElement {
  return h("div", { class: "fact" }, h("span", { class: "muted" }, label), h("strong", {}, value));
}

export function progressBar(step: number, total: number, state?: string): HTMLElement {
  const fraction = total > 0 ? Math.min(1, step / total) : 0;
  const bar = h("div", { class: `progress ${state ? `state-${state.toLowerCase()}` : ""}` });
  bar.append(h("div", { class: "progress-fill", style: `width: ${(fraction * 100).toFixed(1)}%` }));
  return bar;
}

/** A used/total meter such as slots on a node. */
export function meter(used: number, total: number, label: string): HTMLElement {
  const fraction = total > 0 ? Math.min(1, used / total) : 0;
  return h(
    "div",
    { class: "meter" },
    h("div", { class: "meter-label" }, h("span", {}, label), h("strong", {}, `${used} / ${total}`)),
    h(
      "div",
      { class: "progress" },
      h("div", { class: "progress-fill", style: `width: ${(fraction * 100).toFixed(1)}%` }),
    ),
  );
}

export interface Column<T> {
  title: string;
  cell: (row: T) => Node | string;
  className?: string;
}

export function table<T>(
  columns: Column<T>[],
  rows: T[],
  options: { empty?: string; rowAttrs?: (row: T) => Record<string, string> } = {},
): HTMLTableElement {
  const head = h("tr", {}, ...columns.map((c) => h("th", { class: c.className ?? null }, c.title)));
  const body = h("tbody");
  if (rows.length === 0) {
    body.append(
      h(
        "tr",
        { class: "empty" },
        h("td", { colspan: columns.length }, options.empty ?? "Nothing here."),
      ),
    );
  }
  for (const row of rows) {
    const tr = h("tr", options.rowAttrs?.(row) ?? {});
    for (const c of columns) tr.append(h("td", { class: c.className ?? null }, c.cell(row)));
    body.append(tr);
  }
  return h("table", { class: "grid" }, h("thead", {}, head), body);
}

export function section(title: string, ...children: (Node | string)[]): HTMLElement {
  return h("section", { class: "card" }, h("h2", {}, title), ...children);
}

/** Something to act on that is not an error (a submission that selects on the test split). */
export function warningBox(text: string): HTMLElement {
  return h("div", { class: "warning-box", role: "status" }, text);
}

export function errorBox(text: string): HTMLElement {
  return h("div", { class: "error-box", role: "alert" }, text);
}
