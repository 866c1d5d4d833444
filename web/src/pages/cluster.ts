// Cluster: nodes with their slots and GPUs in use, the plugins their processes load (and any
// parameter-server Redis they cannot reach, or a plugin that failed to load there), the running jobs' worker groups and server shards, and the queue in the order the
// scheduler will place it. Refreshed every 2 s.

import { type Cluster, api } from "../api";
import { fill, formatAgo, h } from "../dom";
import { type Scope, errorText } from "../scope";
import { errorBox, meter, section, stateBadge, table } from "../components/widgets";

const REFRESH_MS = 2000;

function jobLink(id: number | null, name: string | null): Node | string {
  if (id === null) return h("span", { class: "muted" }, "another user's job");
  return h("a", { href: `#/jobs/${id}` }, `#${id} ${name ?? ""}`);
}

export function renderCluster(root: HTMLElement, scope: Scope): void {
  const body = h("div", { class: "cluster" });
  const status = h("span", { class: "muted live" });
  root.append(
    h("div", { class: "page-head" }, h("h1", {}, "Cluster"), h("div", { class: "spacer" }), status),
    body,
  );
  scope.every(
    REFRESH_MS,
    async () => {
      const cluster = await api.cluster(scope.signal);
      fill(body, nodesSection(cluster), runningSection(cluster), queueSection(cluster));
      status.textContent = `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
    },
    (error) => fill(body, errorBox(errorText(error))),
  );
}

function nodesSection(cluster: Cluster): HTMLElement {
  const slots = cluster.nodes.reduce((n, x) => n + x.slots, 0);
  const used = cluster.nodes.reduce((n, x) => n + x.slots_used, 0);
  const cards = cluster.nodes.map((node) =>
    h(
      "div",
      { class: "node-card", "data-node": node.name },
      h("div", { class: "node-title" }, h("strong", {}, node.name), stateBadge(node.state)),
      meter(node.slots_used, node.slots, "slots"),
      node.gpus > 0 ? meter(node.gpus_used, node.gpus, "GPUs") : h("div", { class: "muted" }, "no GPUs"),
      h("div", { class: "muted small" }, `heartbeat ${formatAgo(node.last_heartbeat)}`),
      // Jobs with server shards are not placed here until it reaches them.
      ...node.ps_unreachable.map((what) =>
        h("div", { class: "bad small ps-unreachable" }, `cannot reach parameter-server Redis ${what}`),
      ),
      pluginsLine(node.plugins ?? {}),
      // Its agent stays up to say so, and takes no jobs until restarted with the plugin fixed.
      node.plugin_error ? h("div", { class: "bad small plugin-error" }, `takes no jobs: ${node.plugin_error}`) : null,
    ),
  );
  return section(
    `Nodes (${cluster.nodes.length}) · ${used} / ${slots} slots in use`,
    cards.length
      ? h("div", { class: "node-grid", id: "nodes" }, ...cards)
      : h("p", { class: "muted", id: "nodes" }, "No node agent has registered. Start one with `trainyard node`."),
  );
}

// "plugins: trainyard_rmsnorm@1.2, mylayers": a .py file or a module of no distribution has no
// version.
function pluginsLine(plugins: Record<string, string>): Node | null {
  const names = Object.entries(plugins).map(([name, version]) => (version ? `${name}@${version}` : name));
  if (!names.length) return null;
  return h("div", { class: "small plugins" }, `plugins: ${names.join(", ")}`);
}

function runningSection(cluster: Cluster): HTMLElement {
  return section(
    `Running (${cluster.running.length})`,
    table(
      [
        { title: "job", cell: (r) => jobLink(r.job_id, r.name) },
        { title: "state", cell: (r) => stateBadge(r.state) },
        {
          title: "worker groups and server shards",
          cell: (r) =>
            h(
              "div",
              { class: "allocs" },
              ...r.allocations.map((a) =>
                h(
                  "span",
                  { class: `alloc role-${a.role} state-${a.state.toLowerCase()}`, title: a.state },
                  a.role === "server" ? `server ${a.rank}` : `worker g${a.group} r${a.rank}`,
                  h("span", { class: "muted" }, ` @ ${a.node}`),
                ),
              ),
            ),
        },
      ],
      cluster.running,
      { empty: "Nothing is running." },
    ),
  );
}

function queueSection(cluster: Cluster): HTMLElement {
  return section(
    `Queue (${cluster.queue.length})`,
    table(
      [
        { title: "position", cell: (q) => String(q.position), className: "num" },
        { title: "job", cell: (q) => jobLink(q.job_id, q.name) },
        { title: "priority", cell: (q) => String(q.priority), className: "num" },
        { title: "slots", cell: (q) => String(q.slots), className: "num" },
        { title: "GPUs", cell: (q) => String(q.gpus), className: "num" },
        { title: "waiting because", cell: (q) => q.reason || "—" },
      ],
      cluster.queue,
      { empty: "The queue is empty." },
    ),
  );
}
