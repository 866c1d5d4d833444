// A job's environment tab: what its first worker process trained with (Python, torch, CUDA,
// devices, CPU, host, Trainyard version and commit, packages), the facts other processes differ
// in, and each process's package list to download.

import { api } from "../api";
import { fill, formatTime, h } from "../dom";
import { errorText } from "../scope";
import { errorBox, table } from "../components/widgets";
import type { JobContext } from "./job";

const FACTS: [string, string][] = [
  ["python", "Python"],
  ["torch", "torch"],
  ["cuda", "CUDA"],
  ["cudnn", "cuDNN"],
  ["nccl", "NCCL"],
  ["devices", "devices"],
  ["cpu_model", "CPU"],
  ["cpu_count", "CPU count"],
  ["hostname", "host"],
  ["trainyard_version", "Trainyard"],
  ["trainyard_commit", "commit"],
  ["packages_total", "packages"],
  ["packages_hash", "packages SHA-256"],
];

function text(value: unknown): string {
  if (Array.isArray(value)) return value.join(", ");
  if (value === "" || value === null || value === undefined) return "none";
  return String(value);
}

export function environmentTab(pane: HTMLElement, ctx: JobContext): void {
  const host = h("div", { id: "environment", class: "table-wrap narrow" });
  pane.append(host);
  const download = async (group: number, rank: number, button: HTMLButtonElement) => {
    button.disabled = true;
    try {
      // A plain link cannot carry the bearer token: fetch, then save the blob.
      const blob = await api.packagesFile(ctx.id, group, rank);
      const link = h("a", { href: URL.createObjectURL(blob), download: `job${ctx.id}-${group}-${rank}-packages.txt` });
      link.click();
      setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
    } catch (error) {
      alert(`Download failed: ${errorText(error)}`);
    } finally {
      button.disabled = false;
    }
  };
  const load = async () => {
    const env = await api.environment(ctx.id, ctx.scope.signal);
    const [first] = env.processes;
    if (!first) {
      fill(host, h("p", { class: "muted" }, "No worker has reported its environment yet (each does as it starts)."));
      return;
    }
    const facts = first as unknown as Record<string, unknown>;
    fill(
      host,
      h("p", { class: "muted" }, `Worker ${first.group}/${first.rank}, reported ${formatTime(first.reported_at)}.`),
      table(
        [
          { title: "", cell: ([, label]: [string, string]) => label },
          { title: "", cell: ([key]: [string, string]) => h("code", {}, text(facts[key])) },
        ],
        FACTS,
        { rowAttrs: ([key]) => ({ "data-fact": key }) },
      ),
      env.processes.length > 1
        ? h(
            "p",
            { class: "muted" },
            `${env.processes.length} worker processes reported; they differ in: ${env.differing.join(", ") || "nothing"}.`,
          )
        : null,
      table(
        [
          { title: "worker", cell: (p) => `${p.group}/${p.rank}` },
          { title: "host", cell: (p) => p.hostname },
          { title: "packages", cell: (p) => String(p.packages_total), className: "num" },
          {
            title: "",
            cell: (p) => {
              const button = h("button", {}, "Download package list");
              button.addEventListener("click", () => void download(p.group, p.rank, button));
              return button;
            },
          },
        ],
        env.processes,
        { rowAttrs: (p) => ({ "data-process": `${p.group}/${p.rank}` }) },
      ),
    );
  };
  const reload = () => void load().catch((error) => fill(host, errorBox(errorText(error))));
  ctx.on("state", reload);
  reload();
}
