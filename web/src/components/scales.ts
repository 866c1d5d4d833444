// Scales for the sweep charts: a value to a fraction of an axis (0 at one end, 1 at the other)
// on a linear, log or categorical axis, with the axis's ticks. A sweep's space says which one a
// parameter gets: loguniform a log axis, choice a categorical one, the other forms linear.

import { formatValue } from "../dom";

export type ScaleKind = "linear" | "log" | "categorical";

export interface Scale {
  kind: ScaleKind;
  /** linear and log: the lowest and highest value shown */
  low: number;
  high: number;
  /** categorical: the categories, in the order drawn */
  categories: string[];
}

export interface Tick {
  at: number;
  label: string;
}

/** A categorical value's name: choices may be numbers, strings, true/false or null. */
export function category(value: unknown): string {
  return value === null || value === undefined ? "null" : String(value);
}

/**
 * The scale for `values`; `space` is the path's search-space entry (`{loguniform: [a, b]}`,
 * `{choice: [...]}`, ...), whose bounds and choices the axis covers when known.
 */
export function scaleFor(values: unknown[], space?: Record<string, unknown> | null): Scale {
  const choices = space?.choice;
  const numeric = values.filter((v): v is number => typeof v === "number" && Number.isFinite(v));
  if (Array.isArray(choices) || numeric.length < values.length) {
    const categories = Array.isArray(choices) ? choices.map(category) : [];
    for (const value of values) {
      if (!categories.includes(category(value))) categories.push(category(value));
    }
    return { kind: "categorical", low: 0, high: 0, categories };
  }
  const bounds = (space?.loguniform ?? space?.uniform ?? space?.int) as number[] | undefined;
  const log = Array.isArray(space?.loguniform) && numeric.every((v) => v > 0);
  return { kind: log ? "log" : "linear", ...extent(numeric, bounds), categories: [] };
}

/** A linear scale over numbers (metric values, steps), padded a little unless told not to. */
export function linearScale(values: number[], pad = 0.05): Scale {
  const { low, high } = extent(values);
  const span = high - low;
  return { kind: "linear", low: low - span * pad, high: high + span * pad, categories: [] };
}

function extent(values: number[], bounds?: number[]): { low: number; high: number } {
  let low = Math.min(...values, ...(bounds ?? []));
  let high = Math.max(...values, ...(bounds ?? []));
  if (!Number.isFinite(low) || !Number.isFinite(high)) return { low: 0, high: 1 };
  if (low === high) {
    const half = low === 0 ? 1 : Math.abs(low) * 0.1;
    low -= half;
    high += half;
  }
  return { low, high };
}

/** Where `value` falls on the scale, from 0 (low, first category) to 1; null if off it. */
export function position(scale: Scale, value: unknown): number | null {
  if (scale.kind === "categorical") {
    const index = scale.categories.indexOf(category(value));
    if (index < 0) return null;
    return scale.categories.length === 1 ? 0.5 : index / (scale.categories.length - 1);
  }
  if (typeof value !== "number" || !Number.isFinite(value)) return null;
  if (scale.kind === "log") {
    if (value <= 0) return null;
    return Math.log(value / scale.low) / Math.log(scale.high / scale.low);
  }
  return (value - scale.low) / (scale.high - scale.low);
}

/** About `count` ticks: powers of ten on a log axis, 1-2-5 steps on a linear one. */
export function ticks(scale: Scale, count = 5): Tick[] {
  if (scale.kind === "categorical") {
    return scale.categories.map((c) => ({ at: position(scale, c) ?? 0, label: c }));
  }
  if (scale.kind === "log") {
    const first = Math.floor(Math.log10(scale.low));
    const last = Math.ceil(Math.log10(scale.high));
    const out: Tick[] = [];
    for (let power = first; power <= last; power++) {
      for (const m of last - first <= 1 ? [1, 2, 5] : [1]) {
        const value = m * 10 ** power;
        if (value >= scale.low * (1 - 1e-9) && value <= scale.high * (1 + 1e-9)) {
          out.push({ at: position(scale, value) ?? 0, label: formatValue(value) });
        }
      }
    }
    if (out.length >= 2) return out;
    return [scale.low, scale.high].map((v) => ({ at: position(scale, v) ?? 0, label: formatValue(v) }));
  }
  const span = scale.high - scale.low;
  const raw = span / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? raw;
  const out: Tick[] = [];
  for (let value = Math.ceil(scale.low / step) * step; value <= scale.high + step * 1e-9; value += step) {
    const clean = Number(value.toPrecision(12));
    out.push({ at: position(scale, clean) ?? 0, label: formatValue(clean) });
  }
  return out;
}

/** Worst to best as dark blue to yellow (viridis's ends), `t` from 0 to 1. */
export function rampColour(t: number): string {
  const stops = [
    [68, 1, 84],
    [59, 82, 139],
    [33, 145, 140],
    [94, 201, 98],
    [253, 231, 37],
  ];
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  const rgb = stops[i].map((c, k) => Math.round(c + (stops[i + 1][k] - c) * f));
  return `rgb(${rgb.join(", ")})`;
}

/** Ten distinct colours for lines that are told apart by trial. */
export const TRIAL_COLOURS = [
  "#2563eb",
  "#ea580c",
  "#16a34a",
  "#9333ea",
  "#0891b2",
  "#db2777",
  "#ca8a04",
  "#4b5563",
  "#65a30d",
  "#dc2626",
];
