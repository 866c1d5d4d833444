// The job detail tabs that fetch their own data: graph, events, logs and checkpoints.

import { TERMINAL, api } from "../api";
import { fill, formatBytes, formatCount, formatTime, h } from "../dom";
import { errorText } from "../scope";
import { drawGraph } from "../components/graph";
import { errorBox, stateBadge, table } from "../components/widgets";
import type { JobContext } from "./job";

const MAX_LOG_LINES = 5000;
const LOG_POLL_MS = 1000;

export function graphTab(pane: HTMLElement, ctx: JobContext): void {
  const host = h("div", { class: "graph-host", id: "graph" }, h("p", { class: "muted" }, "compiling…"));
  pane.append(
    h(
      "div",
      { class: "legend" },
      h("span", { class: "key kind-input" }, "input"),
      h("span", { class: "key kind-param" }, "has parameters"),
      h("span", { class: "key kind-plain" }, "no parameters"),
      h("span", { class: "key kind-loss" }, "loss"),
      h("span", { class: "muted" }, "shapes are per sample; pdim = partition_dim"),
    ),
    host,
  );
  api
    .graph(ctx.id, ctx.scope.signal)
    .then((graph) => {
      const total = graph.nodes.reduce((n, node) => n + node.params, 0);
      fill(
        host,
        h("p", { class: "muted" }, `${graph.nodes.length} layers, ${formatCount(total)} parameters`),
        drawGraph(graph),
      );
    })
    .catch((error) => fill(host, errorBox(errorText(error))));
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
        { empty: "No checkpoints yet." },
      ),
    );
  };
  const reload = () => void load().catch((error) => fill(host, errorBox(errorText(error))));
  ctx.on("checkpoint", reload);
  ctx.on("state", reload);
  reload();
}
