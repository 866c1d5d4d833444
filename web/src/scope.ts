// A page's lifetime: its timers, streams and requests end together when the user navigates away.

import { ApiError } from "./api";

export type Params = Record<string, string>;
/** A page draws itself into `root`; whatever it starts, it registers with `scope`. */
export type PageRender = (root: HTMLElement, scope: Scope, params: Params) => void;

export class Scope {
  private readonly controller = new AbortController();
  private readonly cleanups: (() => void)[] = [];

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get alive(): boolean {
    return !this.controller.signal.aborted;
  }

  onDispose(fn: () => void): void {
    this.cleanups.push(fn);
  }

  /**
   * Runs `fn` now and then `ms` after each run finishes (never two at once). A failed run shows
   * its error through `onError` and polling goes on: the server may come back.
   */
  every(ms: number, fn: () => Promise<void>, onError?: (error: unknown) => void): void {
    let timer: number | undefined;
    const tick = async () => {
      if (!this.alive) return;
      try {
        await fn();
      } catch (error) {
        if (!this.alive || isAbort(error)) return;
        if (onError) onError(error);
        else console.error(error);
      }
      if (this.alive) timer = window.setTimeout(tick, ms);
    };
    this.onDispose(() => window.clearTimeout(timer));
    void tick();
  }

  dispose(): void {
    this.controller.abort();
    for (const fn of this.cleanups.splice(0).reverse()) fn();
  }
}

export function isAbort(error: unknown): boolean {
  return error instanceof DOMException && error.name === "AbortError";
}

export function errorText(error: unknown): string {
  if (error instanceof ApiError) return error.message;
  if (error instanceof Error) return error.message;
  return String(error);
}
