/** Errors as the daemon reports them: `{"error": {"code", "message", "hint"?}}` plus the HTTP status. */

import type { ErrorBody } from "./wire.js";

export class ZenedgeError extends Error {
  constructor(
    message: string,
    /** HTTP status (0: the daemon could not be reached). */
    readonly status: number,
    /** Stable machine-readable name, e.g. "adapter_not_found", "queue_full", "unauthorized". */
    readonly code: string,
    readonly hint?: string,
    /** Seconds to wait before retrying (503 queue_full). */
    readonly retryAfter?: number,
  ) {
    super(hint ? `${message} (${hint})` : message);
    this.name = "ZenedgeError";
  }

  static fromBody(status: number, body: unknown, retryAfter?: number): ZenedgeError {
    const detail = (body as Partial<ErrorBody> | null)?.error;
    if (detail && typeof detail.code === "string" && typeof detail.message === "string") {
      return new ZenedgeError(detail.message, status, detail.code, detail.hint ?? undefined, retryAfter);
    }
    return new ZenedgeError(`the daemon answered HTTP ${status}`, status, "http_error", undefined, retryAfter);
  }
}

/** Nothing answered: no daemon, a stale socket, or a connection that broke. */
export class DaemonUnavailable extends ZenedgeError {
  constructor(where: string, cause: unknown) {
    super(`cannot reach the zenedge daemon at ${where}: ${cause instanceof Error ? cause.message : String(cause)}`,
      0, "unavailable");
    this.name = "DaemonUnavailable";
  }
}
