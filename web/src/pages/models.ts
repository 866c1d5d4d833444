// Models: the registry (docs/models.md). Every version of your models, by name; register a
// job's checkpoint as the next version of a name, tag a version (production), delete one; a
// version's prediction runs.

import { type ModelVersionOut, api } from "../api";
import { fill, formatTime, formatValue, h } from "../dom";
import { Scope, errorText } from "../scope";
import { type Column, errorBox, table } from "../components/widgets";
import { predictionRuns } from "./jobtabs";

export function objective(v: ModelVersionOut): string {
  return `${v.objective} ${formatValue(v.objective_value)} (${v.objective_mode})`;
}

export function renderModels(root: HTMLElement, scope: Scope): void {
  const body = h("div", { class: "table-wrap", id: "models" });
  const runs = h("section", { class: "card", id: "model-predictions", hidden: true });
  const message = h("div", { class: "muted", id: "model-message" });
  const name = h("input", { id: "model-name", placeholder: "name", required: true });
  const job = h("input", { id: "model-job", placeholder: "job id", type: "number", min: "1" });
  const checkpoint = h(
    "select",
    { id: "model-checkpoint" },
    h("option", { value: "" }, "best (else latest)"),
    h("option", { value: "best" }, "best"),
    h("option", { value: "latest" }, "latest"),
  );

  const load = async () => {
    const versions = await api.models(scope.signal);
    fill(body, table(columns(), versions, { empty: "No models yet: register a job's checkpoint above.", rowAttrs: (v) => ({ "data-model": v.ref }) }));
  };
  const onError = (error: unknown) => fill(message, errorBox(errorText(error)));
  // Each list of runs shown gets its own scope: the one shown before stops polling.
  let shownRuns: Scope | null = null;
  const showRuns = (v: ModelVersionOut) => {
    shownRuns?.dispose();
    const own = new Scope();
    scope.onDispose(() => own.dispose());
    shownRuns = own;
    const host = h("div", { class: "table-wrap" });
    fill(runs, h("h2", {}, `Prediction runs of ${v.ref}`), host);
    runs.hidden = false;
    predictionRuns(host, own, (signal) => api.modelPredictions(v.name, v.version, signal), `No prediction runs of ${v.ref}.`);
  };
  const act = (work: () => Promise<string>) =>
    work()
      .then((done) => {
        fill(message, done);
        return load();
      })
      .catch(onError);

  const columns = (): Column<ModelVersionOut>[] => [
    { title: "Model", cell: (v) => h("strong", {}, v.ref) },
    {
      title: "Tags",
      cell: (v) => (v.tags.length ? h("span", { class: "tags" }, ...v.tags.map((t) => h("span", { class: "badge tag" }, t))) : "—"),
    },
    {
      title: "Job",
      cell: (v) => (v.job_id === null ? v.job_name : h("a", { href: `#/jobs/${v.job_id}` }, `#${v.job_id} ${v.job_name}`)),
    },
    { title: "Step", cell: (v) => String(v.step), className: "num" },
    { title: "Objective", cell: objective, className: "num objective" },
    { title: "Input", cell: (v) => `${String(v.input.x_dtype)} ${JSON.stringify(v.input.sample_shape)}` },
    { title: "Registered", cell: (v) => formatTime(v.created_at), className: "num" },
    {
      title: "",
      cell: (v) => {
        const tag = h("input", { class: "tag-input", placeholder: "tag", size: 10 });
        return h(
          "div",
          { class: "row-actions" },
          h("button", { class: "runs-button", onclick: () => showRuns(v) }, "Prediction runs"),
          tag,
          h(
            "button",
            { class: "tag-button", onclick: () => act(async () => `${(await api.tagModel(v.name, v.version, tag.value.trim())).ref} tagged ${tag.value.trim()}`) },
            "Tag",
          ),
          h(
            "button",
            {
              class: "delete-button",
              onclick: () => {
                if (confirm(`Delete ${v.ref}? Its job and the job's checkpoints stay.`)) {
                  act(async () => {
                    await api.deleteModel(v.name, v.version);
                    return `deleted ${v.ref}`;
                  });
                }
              },
            },
            "Delete",
          ),
        );
      },
    },
  ];

  const register = h(
    "form",
    {
      class: "register-model",
      onsubmit: (event: Event) => {
        event.preventDefault();
        act(async () => {
          const version = await api.registerModel(name.value.trim(), Number(job.value), checkpoint.value || null);
          return `registered ${version.ref}: job ${version.job_id} step ${version.step}, ${objective(version)}`;
        });
      },
    },
    name,
    job,
    checkpoint,
    h("button", { class: "primary", type: "submit" }, "Register"),
  );
  root.append(
    h("div", { class: "page-head" }, h("h1", {}, "Models"), h("div", { class: "spacer" })),
    register,
    message,
    body,
    runs,
  );
  load().catch(onError);
}
