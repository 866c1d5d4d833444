// New job: write YAML (or start from an example), see it validated as you type — each problem
// marked on its line, the layer table and the placement plan of the dry run — and submit.

import { setDiagnostics } from "@codemirror/lint";

import { ApiError, type Example, type SpecIssue, type Validation, api } from "../api";
import { fill, formatCount, formatShape, h } from "../dom";
import { type Scope, errorText } from "../scope";
import {
  DRAFT_KEY,
  goToLine,
  issueToDiagnostic,
  setText,
  yamlEditor,
} from "../components/editor";
import { errorBox, table } from "../components/widgets";

// What an empty editor starts with: the example `make run` trains.
const FIRST_EXAMPLE = "mnist1d_cnn";

/** A document with a top-level `search:` section is a sweep: POST /sweeps takes it. */
export function isSweep(text: string): boolean {
  return /^search[ \t]*:/m.test(text);
}

export function renderNewJob(root: HTMLElement, scope: Scope): void {
  const examples = h(
    "select",
    { id: "example", "aria-label": "start from an example" },
    h("option", { value: "" }, "Start from an example…"),
  );
  const priority = h("input", {
    id: "priority",
    type: "number",
    value: "0",
    step: "1",
    title: "higher runs first",
  });
  const submit = h("button", { class: "primary", id: "submit" }, isSweep(localStorage.getItem(DRAFT_KEY) ?? "") ? "Submit sweep" : "Submit job");
  const verdict = h("span", { class: "verdict muted", id: "verdict" }, "checking…");
  const editorHost = h("div", { class: "editor", id: "editor" });
  const report = h("div", { class: "report", id: "report" });

  root.classList.add("new-job");
  root.append(
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, "New job"),
      verdict,
      h("div", { class: "spacer" }),
      examples,
      h("label", { class: "inline", for: "priority" }, "priority", priority),
      submit,
    ),
    h("div", { class: "editor-layout" }, editorHost, report),
  );

  let latest = localStorage.getItem(DRAFT_KEY) ?? "";
  const check = async (text: string): Promise<SpecIssue[]> => {
    localStorage.setItem(DRAFT_KEY, text);
    let issues: SpecIssue[] = [];
    try {
      const result = await api.validate(text, scope.signal);
      if (text === latest) showValid(result);
    } catch (error) {
      issues = issuesOf(error);
      if (text === latest) showProblems(issues, error);
    }
    // An answer about a text edited since shows nowhere (the editor drops its markers too).
    return issues;
  };

  const view = yamlEditor(editorHost, {
    doc: latest,
    check,
    onChange: (text) => {
      // Until the linter has checked this text, the verdict shown is about an older one.
      latest = text;
      submit.textContent = isSweep(text) ? "Submit sweep" : "Submit job";
      verdict.className = "verdict muted";
      verdict.textContent = "checking…";
    },
  });
  scope.onDispose(() => view.destroy());

  function showValid(result: Validation): void {
    verdict.className = "verdict ok";
    const what = isSweep(latest) ? " sweep — base job:" : " —";
    verdict.textContent = `✓ valid${what} ${result.layers.length} layers, ${formatCount(result.total_params)} parameters`;
    fill(report, layerSection(result), placementSection(result));
  }

  function showProblems(issues: SpecIssue[], error: unknown): void {
    verdict.className = "verdict bad";
    if (!(error instanceof ApiError) || error.status !== 422) {
      verdict.textContent = "✗ could not validate";
      fill(report, errorBox(errorText(error)));
      return;
    }
    verdict.textContent = `✗ ${issues.length} problem${issues.length === 1 ? "" : "s"}`;
    const list = h("ol", { class: "problems", id: "problems" });
    const byLine = [...issues].sort((a, b) => (a.line ?? 0) - (b.line ?? 0));
    for (const issue of byLine) {
      list.append(
        h(
          "li",
          {
            onclick: () => issue.line && goToLine(view, issue.line),
            class: issue.line ? "clickable" : null,
          },
          h("span", { class: "where" }, issue.line ? `line ${issue.line}` : "document"),
          h("code", {}, issue.path),
          h("div", { class: "message" }, issue.message),
          issue.hint ? h("div", { class: "hint" }, `hint: ${issue.hint}`) : null,
        ),
      );
    }
    fill(report, h("section", { class: "card" }, h("h2", {}, "Problems"), list));
  }

  submit.addEventListener("click", async () => {
    submit.disabled = true;
    try {
      const text = view.state.doc.toString();
      const level = Number(priority.value) || 0;
      if (isSweep(text)) {
        const sweep = await api.submitSweep(text, level);
        location.hash = `#/sweeps/${sweep.id}`;
      } else {
        const job = await api.submit(text, level);
        location.hash = `#/jobs/${job.id}`;
      }
    } catch (error) {
      const issues = issuesOf(error);
      showProblems(issues, error);
      const doc = view.state.doc;
      view.dispatch(setDiagnostics(view.state, issues.map((i) => issueToDiagnostic(doc, i))));
    } finally {
      submit.disabled = false;
    }
  });

  examples.addEventListener("change", () => {
    const chosen = loaded.find((e) => e.name === examples.value);
    if (chosen) setText(view, chosen.yaml);
    examples.value = "";
  });

  let loaded: Example[] = [];
  api
    .examples()
    .then((list) => {
      if (!scope.alive) return;
      loaded = list;
      for (const example of list) {
        examples.append(
          h("option", { value: example.name, title: example.description }, example.name),
        );
      }
      const first = list.find((e) => e.name === FIRST_EXAMPLE) ?? list[0];
      if (view.state.doc.length === 0 && first) setText(view, first.yaml);
    })
    .catch((error) => fill(report, errorBox(`examples: ${errorText(error)}`)));
}

function issuesOf(error: unknown): SpecIssue[] {
  if (!(error instanceof ApiError) || error.status !== 422) return [];
  if (error.issues.length > 0) return error.issues;
  return [{ path: "<document>", message: error.message, line: null, column: null, hint: null }];
}

function layerSection(result: Validation): HTMLElement {
  return h(
    "section",
    { class: "card" },
    h("h2", {}, `Layers of ${result.name}`),
    table(
      [
        { title: "layer", cell: (l) => h("strong", {}, l.name) },
        { title: "type", cell: (l) => l.type },
        { title: "sources", cell: (l) => l.sources.join(", ") || "—" },
        { title: "output", cell: (l) => formatShape(l.out_shape), className: "num" },
        { title: "params", cell: (l) => formatCount(l.params), className: "num" },
        { title: "pdim", cell: (l) => String(l.partition_dim), className: "num" },
      ],
      result.layers,
      { rowAttrs: () => ({ class: "layer-row" }) },
    ),
    h("p", { class: "muted" }, `total parameters: ${formatCount(result.total_params)}`),
  );
}

function placementSection(result: Validation): HTMLElement {
  const { placement, topology } = result;
  const facts = Object.entries(topology)
    .filter(([, v]) => typeof v !== "object" || v === null)
    .map(([k, v]) => h("span", { class: "fact" }, `${k.replace(/_/g, " ")}: `, h("strong", {}, String(v))));
  return h(
    "section",
    { class: "card", id: "placement" },
    h("h2", {}, "Placement plan"),
    h("div", { class: "facts" }, ...facts),
    h(
      "p",
      { class: placement.feasible ? "ok" : "bad", id: "placement-verdict" },
      placement.feasible ? "✓ " : "✗ ",
      placement.reason || (placement.feasible ? "fits the cluster now" : "does not fit now"),
    ),
    table(
      [
        { title: "role", cell: (a) => a.role },
        { title: "group", cell: (a) => String(a.group), className: "num" },
        { title: "rank", cell: (a) => String(a.rank), className: "num" },
        { title: "node", cell: (a) => a.node },
        { title: "slots", cell: (a) => String(a.slots), className: "num" },
        { title: "gpus", cell: (a) => String(a.gpus), className: "num" },
      ],
      placement.assignments,
      { empty: "No assignment." },
    ),
  );
}
