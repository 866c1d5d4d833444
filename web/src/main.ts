// The shell: top bar, hash router and sign-in gate. Pages render into #page and get a Scope
// that ends their polling and streams when the route changes.

import "./styles.css";
import { getToken, setToken } from "./api";
import { fill, h } from "./dom";
import { type PageRender, type Params, Scope, errorText } from "./scope";

interface Route {
  pattern: RegExp;
  keys: string[];
  nav: string;
  load: () => Promise<PageRender>;
}

function route(path: string, nav: string, load: () => Promise<PageRender>): Route {
  const keys: string[] = [];
  const source = path.replace(/:(\w+)(\?)?/g, (_, key: string, optional?: string) => {
    keys.push(key);
    return optional ? "?([^/]*)" : "([^/]+)";
  });
  return { pattern: new RegExp(`^${source}$`), keys, nav, load };
}

// The editor and chart pages pull in CodeMirror and uPlot; they load only when visited.
const ROUTES: Route[] = [
  route("/signin", "", async () => (await import("./pages/signin")).renderSignIn),
  route("/jobs", "jobs", async () => (await import("./pages/jobs")).renderJobs),
  route("/new", "new", async () => (await import("./pages/newjob")).renderNewJob),
  route("/jobs/:id/:tab?", "jobs", async () => (await import("./pages/job")).renderJob),
  route("/compare/:ids", "jobs", async () => (await import("./pages/compare")).renderCompare),
  route("/sweeps", "sweeps", async () => (await import("./pages/sweeps")).renderSweeps),
  route("/sweeps/:id", "sweeps", async () => (await import("./pages/sweep")).renderSweep),
  route("/cluster", "cluster", async () => (await import("./pages/cluster")).renderCluster),
  route("/models", "models", async () => (await import("./pages/models")).renderModels),
];

const app = document.getElementById("app") as HTMLElement;
const page = h("main", { id: "page" });
const navLinks = {
  jobs: h("a", { href: "#/jobs" }, "Jobs"),
  sweeps: h("a", { href: "#/sweeps" }, "Sweeps"),
  new: h("a", { href: "#/new" }, "New job"),
  cluster: h("a", { href: "#/cluster" }, "Cluster"),
  models: h("a", { href: "#/models" }, "Models"),
};
const signOut = h(
  "button",
  {
    class: "link",
    onclick: () => {
      setToken(null);
      location.hash = "#/signin";
    },
  },
  "Sign out",
);
const topbar = h(
  "header",
  { class: "topbar" },
  h("a", { class: "brand", href: "#/jobs" }, h("span", { class: "logo" }), "Trainyard"),
  h("nav", {}, navLinks.jobs, navLinks.sweeps, navLinks.new, navLinks.cluster, navLinks.models),
  h("div", { class: "spacer" }),
  signOut,
);
fill(app, topbar, page);

let current: Scope | null = null;
let generation = 0;

async function show(): Promise<void> {
  const path = location.hash.replace(/^#/, "").split("?")[0] || "/jobs";
  if (!getToken() && path !== "/signin") {
    sessionStorage.setItem("trainyard.after-signin", location.hash || "#/jobs");
    location.replace("#/signin");
    return;
  }
  const match = ROUTES.map((r) => ({ r, m: r.pattern.exec(path) })).find((x) => x.m);
  if (!match || !match.m) {
    location.replace("#/jobs");
    return;
  }
  current?.dispose();
  const scope = new Scope();
  current = scope;
  const mine = ++generation;
  const params: Params = {};
  match.r.keys.forEach((key, i) => {
    if (match.m?.[i + 1]) params[key] = decodeURIComponent(match.m[i + 1]);
  });
  for (const [key, link] of Object.entries(navLinks)) {
    link.classList.toggle("active", key === match.r.nav);
  }
  topbar.classList.toggle("hidden", path === "/signin");
  try {
    const render = await match.r.load();
    if (mine !== generation) return;
    const root = h("div", { class: "page" });
    fill(page, root);
    render(root, scope, params);
  } catch (error) {
    fill(page, h("div", { class: "page" }, h("p", { class: "error-box" }, errorText(error))));
  }
}

window.addEventListener("hashchange", () => void show());
window.addEventListener("trainyard:signed-out", () => {
  sessionStorage.setItem("trainyard.after-signin", location.hash || "#/jobs");
  location.hash = "#/signin";
});
void show();
