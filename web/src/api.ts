// The dashboard's only door to the server: typed calls to /api/v1 with the signed-in token.

export const API = "/api/v1";
const TOKEN_KEY = "trainyard.token";

export type JobState = "QUEUED" | "SCHEDULED" | "RUNNING" | "SUCCEEDED" | "FAILED" | "CANCELLED";
export const JOB_STATES: JobState[] = [
  "QUEUED",
  "SCHEDULED",
  "RUNNING",
  "SUCCEEDED",
  "FAILED",
  "CANCELLED",
];
export const TERMINAL: ReadonlySet<string> = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

export interface Job {
  id: number;
  name: string;
  owner: string;
  state: JobState;
  priority: number;
  framework: string;
  train_steps: number;
  step: number;
  progress: number;
  created_at: string;
  scheduled_at: string | null;
  started_at: string | null;
  ended_at: string | null;
  duration_seconds: number | null;
  summary: Record<string, unknown>;
  best_metric: number | null;
  error: string | null;
  overrides: Record<string, unknown>;
  topology: Record<string, unknown>;
  queue_position: number | null;
  cancel_requested: boolean;
  spec_yaml?: string;
}

export interface JobPage {
  items: Job[];
  next_cursor: string | null;
}

/** A located problem in a job document; `line`/`column` are 1-based. */
export interface SpecIssue {
  path: string;
  message: string;
  line: number | null;
  column: number | null;
  hint: string | null;
}

export interface LayerRow {
  name: string;
  type: string;
  sources: string[];
  out_shape: number[] | number[][];
  params: number;
  partition_dim: number;
}

export interface Assignment {
  role: string;
  group: number;
  rank: number;
  node: string;
  slots: number;
  gpus: number;
}

export interface Validation {
  name: string;
  layers: LayerRow[];
  total_params: number;
  topology: Record<string, unknown>;
  placement: { feasible: boolean; reason: string; assignments: Assignment[] };
}

export interface Series {
  name: string;
  group: number;
  rank: number;
  /** [step, value]; null where the value was NaN or infinite. */
  points: [number, number | null][];
}

export interface LogLine {
  id: number;
  /** Unix time (seconds) the worker wrote the line. */
  at: number;
  group: number;
  rank: number;
  line: string;
}

export interface JobEvent {
  at: string;
  state: string;
  reason: string;
}

export interface GraphNode {
  name: string;
  type: string;
  out_shape: number[] | number[][];
  params: number;
  partition_dim: number;
  /** Phases the layer runs in (train, test); null for both. */
  include: string[] | null;
}

export interface Graph {
  nodes: GraphNode[];
  edges: { source: string; target: string }[];
}

export interface Checkpoint {
  step: number;
  size: number;
  created_at: string;
}

export interface ClusterNode {
  name: string;
  state: string;
  slots: number;
  gpus: number;
  slots_used: number;
  gpus_used: number;
  last_heartbeat: string;
}

export interface Cluster {
  nodes: ClusterNode[];
  // Other users' jobs show without id and name (unless the caller is an admin).
  running: {
    job_id: number | null;
    name: string | null;
    state: string;
    allocations: { node: string; role: string; group: number; rank: number; state: string }[];
  }[];
  queue: {
    job_id: number | null;
    name: string | null;
    priority: number;
    position: number;
    slots: number;
    gpus: number;
    reason: string;
  }[];
}

export interface Example {
  name: string;
  description: string;
  yaml: string;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly issues: SpecIssue[] = [],
  ) {
    super(message);
  }
}

export function getToken(): string | null {
  return localStorage.getItem(TOKEN_KEY);
}

export function setToken(token: string | null): void {
  if (token) localStorage.setItem(TOKEN_KEY, token);
  else localStorage.removeItem(TOKEN_KEY);
}

type Query = Record<string, string | number | null | undefined | (string | number)[]>;

function url(path: string, query: Query = {}): string {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value === null || value === undefined || value === "") continue;
    for (const item of Array.isArray(value) ? value : [value]) params.append(key, String(item));
  }
  const text = params.toString();
  return `${API}${path}${text ? `?${text}` : ""}`;
}

interface RequestOptions {
  method?: string;
  query?: Query;
  body?: BodyInit;
  contentType?: string;
  signal?: AbortSignal;
  token?: string;
}

async function send(path: string, options: RequestOptions = {}): Promise<Response> {
  const headers: Record<string, string> = { Accept: "application/json" };
  const token = options.token ?? getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (options.contentType) headers["Content-Type"] = options.contentType;
  const response = await fetch(url(path, options.query), {
    method: options.method ?? "GET",
    headers,
    body: options.body,
    signal: options.signal,
  });
  if (response.ok) return response;
  let detail = `${response.status} ${response.statusText}`;
  let issues: SpecIssue[] = [];
  try {
    const body = await response.json();
    if (typeof body.detail === "string") detail = body.detail;
    else if (body.detail !== undefined) detail = JSON.stringify(body.detail);
    if (Array.isArray(body.errors)) issues = body.errors;
  } catch {
    // Not JSON (a proxy's error page): the status line is all we can say.
  }
  if (response.status === 401 && !options.token) {
    // The stored token stopped working: back to the sign-in page.
    setToken(null);
    window.dispatchEvent(new CustomEvent("trainyard:signed-out", { detail }));
  }
  throw new ApiError(response.status, detail, issues);
}

async function json<T>(path: string, options: RequestOptions = {}): Promise<T> {
  return (await send(path, options)).json() as Promise<T>;
}

export const api = {
  /** Checks a token before storing it; returns the first page so the caller knows it works. */
  probe: (token: string) => json<JobPage>("/jobs", { query: { limit: 1 }, token }),

  jobs: (query: { state?: string; name?: string; limit?: number; cursor?: string | null }, signal?: AbortSignal) =>
    json<JobPage>("/jobs", { query, signal }),
  job: (id: number, signal?: AbortSignal) => json<Job>(`/jobs/${id}`, { signal }),
  validate: (yaml: string, signal?: AbortSignal) =>
    json<Validation>("/jobs/validate", {
      method: "POST",
      body: yaml,
      contentType: "application/yaml",
      signal,
    }),
  submit: (yaml: string, priority: number) =>
    json<Job>("/jobs", {
      method: "POST",
      body: yaml,
      contentType: "application/yaml",
      query: { priority },
    }),
  cancel: (id: number) => json<Job>(`/jobs/${id}/cancel`, { method: "POST" }),
  metrics: (id: number, maxPoints: number, signal?: AbortSignal) =>
    json<{ series: Series[] }>(`/jobs/${id}/metrics`, {
      query: { max_points: maxPoints },
      signal,
    }),
  logs: (id: number, after: number | null, signal?: AbortSignal) =>
    json<{ lines: LogLine[]; next: number }>(`/jobs/${id}/logs`, {
      query: { after, limit: 500 },
      signal,
    }),
  events: (id: number, signal?: AbortSignal) => json<JobEvent[]>(`/jobs/${id}/events`, { signal }),
  graph: (id: number, signal?: AbortSignal) => json<Graph>(`/jobs/${id}/graph`, { signal }),
  checkpoints: (id: number, signal?: AbortSignal) =>
    json<Checkpoint[]>(`/jobs/${id}/checkpoints`, { signal }),
  checkpointFile: async (id: number, step: number): Promise<Blob> =>
    (await send(`/jobs/${id}/checkpoints/${step}`)).blob(),
  cluster: (signal?: AbortSignal) => json<Cluster>("/cluster", { signal }),
  examples: () => json<Example[]>("/examples"),
};

/** The live stream of a job. EventSource cannot send headers, so the token rides in the query. */
export function streamUrl(id: number): string {
  return url(`/jobs/${id}/stream`, { token: getToken() });
}
