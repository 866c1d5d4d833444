// The dashboard's only door to the server: typed calls to /api/v1 with the signed-in token.

import type {
  CheckpointOut,
  ClusterOut,
  ComparisonOut,
  CurveOut,
  EventOut,
  ExampleOut,
  GraphNode as GraphNodeOut,
  GraphOut,
  Issue,
  JobDetail,
  JobEnvironmentOut,
  JobOut,
  JobPage,
  JobState,
  LogsOut,
  MetricsOut,
  ModelVersionOut,
  PipelineOut,
  PredictionOut,
  SeriesOut,
  StageTimelineOut,
  StreamTicket,
  SweepDetail,
  SweepPage,
  TrialOut,
  ValidationOut,
} from "./types.gen";

export type { JobPage, JobState, ModelVersionOut, PredictionOut, SweepDetail, SweepOut, SweepPage } from "./types.gen";

export const API = "/api/v1";
const TOKEN_KEY = "trainyard.token";

// The response bodies come from types.gen.ts, generated from the API's schemas
// (scripts/gen_types.py); the names below are the ones the pages use.
export const JOB_STATES: JobState[] = [
  "QUEUED",
  "SCHEDULED",
  "RUNNING",
  "SUCCEEDED",
  "FAILED",
  "CANCELLED",
  "PRUNED",
];
export const TERMINAL: ReadonlySet<string> = new Set(["SUCCEEDED", "FAILED", "CANCELLED", "PRUNED"]);

/** A job as listed; fetched by id (JobDetail) it also carries the submitted document and the
 * effective one (its overrides applied). */
export type Job = JobOut &
  Partial<Pick<JobDetail, "spec_yaml" | "effective_yaml" | "override_lines" | "warnings">>;

/** What the job runs: the submitted document with its overrides applied. */
export function effectiveYaml(job: Job): string {
  return job.effective_yaml ?? job.spec_yaml ?? "";
}
/** A located problem in a job document; `line`/`column` are 1-based. */
export type SpecIssue = Issue;
export type Validation = ValidationOut;
export type Series = SeriesOut;
export type GraphNode = GraphNodeOut;
export type Graph = GraphOut;
export type Cluster = ClusterOut;
export type Example = ExampleOut;
export type Pipeline = PipelineOut;
/** Several jobs side by side (GET /compare), and one job's curve of one metric there. */
export type Comparison = ComparisonOut;
export type CompareCurve = CurveOut;
/** What each worker process of a job trained with. */
export type JobEnvironment = JobEnvironmentOut;
/** One pipeline stage's latest timeline (the `timeline` stream event has the same shape). */
export type StageTimeline = StageTimelineOut;

export const SWEEP_TERMINAL: ReadonlySet<string> = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

// Not in types.gen.ts yet: GET /sweeps/{id}/importance and a PBT trial's `schedule` come with
// population-based training and parameter importance (branch sweeps2); regenerating the types
// at the merge replaces these two.
/** Optuna's importance of each searched path for the metric, over the completed trials. */
export interface SweepImportance {
  metric: string;
  importances: Record<string, number>;
  evaluator: string;
  trials: number;
}
/** From `step` on, a PBT trial trained with `params`; `from_trial` when it continued from that
 * trial's checkpoint (exploit), null for its first values. */
export interface ScheduleEntry {
  step: number;
  params: Record<string, unknown>;
  from_trial: number | null;
}
/** A trial; a PBT sweep's trials also carry their schedule of hyperparameters over steps. */
export type Trial = TrialOut & { schedule?: ScheduleEntry[] | null };

/** A pipelined job's topology counts its stages (one worker of each group per stage). */
export function isPipelined(job: Job): boolean {
  return Number(job.topology.stages ?? 1) > 1;
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

export type JobFile = "metrics.csv" | "logs.txt" | "tensorboard";

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
  job: (id: number, signal?: AbortSignal) => json<JobDetail>(`/jobs/${id}`, { signal }),
  validate: (yaml: string, signal?: AbortSignal) =>
    json<Validation>("/jobs/validate", {
      method: "POST",
      body: yaml,
      contentType: "application/yaml",
      signal,
    }),
  submit: (yaml: string, priority: number) =>
    json<JobDetail>("/jobs", {
      method: "POST",
      body: yaml,
      contentType: "application/yaml",
      query: { priority },
    }),
  cancel: (id: number) => json<JobDetail>(`/jobs/${id}/cancel`, { method: "POST" }),
  metrics: (id: number, maxPoints: number, signal?: AbortSignal, names?: string[]) =>
    json<MetricsOut>(`/jobs/${id}/metrics`, {
      query: { max_points: maxPoints, name: names },
      signal,
    }),
  logs: (id: number, after: number | null, signal?: AbortSignal) =>
    json<LogsOut>(`/jobs/${id}/logs`, {
      query: { after, limit: 500 },
      signal,
    }),
  events: (id: number, signal?: AbortSignal) => json<EventOut[]>(`/jobs/${id}/events`, { signal }),
  graph: (id: number, signal?: AbortSignal) => json<Graph>(`/jobs/${id}/graph`, { signal }),
  pipeline: (id: number, signal?: AbortSignal) =>
    json<Pipeline>(`/jobs/${id}/pipeline`, { signal }),
  checkpoints: (id: number, signal?: AbortSignal) =>
    json<CheckpointOut[]>(`/jobs/${id}/checkpoints`, { signal }),
  checkpointFile: async (id: number, step: number): Promise<Blob> =>
    (await send(`/jobs/${id}/checkpoints/${step}`)).blob(),
  environment: (id: number, signal?: AbortSignal) =>
    json<JobEnvironment>(`/jobs/${id}/environment`, { signal }),
  packagesFile: async (id: number, group: number, rank: number): Promise<Blob> =>
    (await send(`/jobs/${id}/environment/packages`, { query: { group, rank } })).blob(),
  compare: (ids: number[], signal?: AbortSignal) =>
    json<Comparison>("/compare", { query: { jobs: ids.join(",") }, signal }),
  predictions: (id: number, signal?: AbortSignal) =>
    json<PredictionOut[]>(`/jobs/${id}/predictions`, { signal }),
  /** The prediction run a job of kind `prediction` places. */
  runOfJob: (id: number, signal?: AbortSignal) => json<PredictionOut>(`/jobs/${id}/prediction`, { signal }),
  modelPredictions: (name: string, version: number, signal?: AbortSignal) =>
    json<PredictionOut[]>(`/models/${encodeURIComponent(name)}/${version}/predictions`, { signal }),
  predictionOutput: async (id: number): Promise<Blob> =>
    (await send(`/predictions/${id}/output`)).blob(),
  // A job's records as files: metrics.csv, logs.txt or tensorboard (a tar of event files).
  jobFile: async (id: number, file: JobFile): Promise<Blob> => (await send(`/jobs/${id}/${file}`)).blob(),
  sweeps: (query: { limit?: number; before?: number | null }, signal?: AbortSignal) =>
    json<SweepPage>("/sweeps", { query, signal }),
  sweep: (id: number, signal?: AbortSignal) => json<SweepDetail>(`/sweeps/${id}`, { signal }),
  submitSweep: (yaml: string, priority: number) =>
    json<SweepDetail>("/sweeps", {
      method: "POST",
      body: yaml,
      contentType: "application/yaml",
      query: { priority },
    }),
  cancelSweep: (id: number) => json<SweepDetail>(`/sweeps/${id}/cancel`, { method: "POST" }),
  importance: (id: number, signal?: AbortSignal) =>
    json<SweepImportance>(`/sweeps/${id}/importance`, { signal }),
  cluster: (signal?: AbortSignal) => json<Cluster>("/cluster", { signal }),
  models: (signal?: AbortSignal) => json<ModelVersionOut[]>("/models", { signal }),
  registerModel: (name: string, jobId: number, checkpoint: string | null) =>
    json<ModelVersionOut>("/models", {
      method: "POST",
      body: JSON.stringify({ name, job_id: jobId, ...(checkpoint ? { checkpoint } : {}) }),
      contentType: "application/json",
    }),
  tagModel: (name: string, version: number, tag: string) =>
    json<ModelVersionOut>(`/models/${encodeURIComponent(name)}/${version}/tags`, {
      method: "POST",
      body: JSON.stringify({ tag }),
      contentType: "application/json",
    }),
  deleteModel: async (name: string, version: number): Promise<void> => {
    await send(`/models/${encodeURIComponent(name)}/${version}`, { method: "DELETE" });
  },
  examples: () => json<Example[]>("/examples"),
};

/**
 * The live stream of a job. EventSource cannot send headers, and the long-lived token must not
 * ride in a URL (logs, history): the URL carries a ticket that opens this job's stream once,
 * within a minute. `lastEventId` resumes after the last event seen (a reconnection).
 */
export async function streamUrl(id: number, lastEventId?: string): Promise<string> {
  const { ticket } = await json<StreamTicket>(`/jobs/${id}/stream-ticket`, { method: "POST" });
  return url(`/jobs/${id}/stream`, { ticket, last_event_id: lastEventId });
}
