/**
 * The zenedge client: every endpoint of the daemon, typed by ./wire.ts (generated from
 * desktop/openapi.json). Streams are async iterators; leaving a `for await` early (break, throw,
 * or the AbortSignal) closes the connection, and the daemon cancels that generation.
 */

import { DaemonUnavailable, ZenedgeError } from "./errors.js";
import { lines, sseData } from "./lines.js";
import type { Transport, TransportResponse } from "./transport.js";
import type {
  BudgetPlan, BudgetStatus, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Completion,
  CompletionRequest, EmbeddingList, EmbeddingRequest, Health, MaintainResult, ModelList, PoolList, PoolStatus, Ps,
  PullProgress, RmResult,
} from "./wire.js";

export interface CallOptions {
  signal?: AbortSignal;
}

type Method = "GET" | "POST" | "PUT";

export class ZenedgeClient {
  constructor(readonly transport: Transport) {}

  // -- OpenAI-compatible ---------------------------------------------------------------------
  health(options?: CallOptions): Promise<Health> {
    return this.json("GET", "/health", undefined, options);
  }

  models(options?: CallOptions): Promise<ModelList> {
    return this.json("GET", "/v1/models", undefined, options);
  }

  chat(request: ChatCompletionRequest, options?: CallOptions): Promise<ChatCompletion> {
    return this.json("POST", "/v1/chat/completions", { ...request, stream: false }, options);
  }

  /** Chunks until `[DONE]`; with `stream_options: {include_usage: true}` the last one carries usage. */
  chatStream(request: ChatCompletionRequest, options?: CallOptions): AsyncGenerator<ChatCompletionChunk> {
    return this.events("/v1/chat/completions", { ...request, stream: true }, options);
  }

  complete(request: CompletionRequest, options?: CallOptions): Promise<Completion> {
    return this.json("POST", "/v1/completions", { ...request, stream: false }, options);
  }

  completeStream(request: CompletionRequest, options?: CallOptions): AsyncGenerator<Completion> {
    return this.events("/v1/completions", { ...request, stream: true }, options);
  }

  /** Unit vectors from the profile (or base) named by `model`, one per input, as floats. */
  embeddings(request: EmbeddingRequest, options?: CallOptions): Promise<EmbeddingList> {
    return this.json("POST", "/v1/embeddings", { ...request, encoding_format: "float" }, options);
  }

  // -- native --------------------------------------------------------------------------------
  list(options?: CallOptions): Promise<PoolList> {
    return this.json("GET", "/api/list", undefined, options);
  }

  ps(options?: CallOptions): Promise<Ps> {
    return this.json("GET", "/api/ps", undefined, options);
  }

  rm(name: string, options?: CallOptions): Promise<RmResult> {
    return this.json("POST", "/api/rm", { name }, options);
  }

  budget(options?: CallOptions): Promise<BudgetStatus> {
    return this.json("GET", "/api/budget", undefined, options);
  }

  setBudget(size: string, dryRun = false, options?: CallOptions): Promise<BudgetPlan> {
    return this.json("PUT", "/api/budget", { size, dry_run: dryRun }, options);
  }

  pool(options?: CallOptions): Promise<PoolStatus> {
    return this.json("GET", "/api/pool", undefined, options);
  }

  maintain(options?: CallOptions): Promise<MaintainResult> {
    return this.json("POST", "/api/pool", undefined, options);
  }

  /** Progress lines; the last has status "success" and the pulled profile's fields. */
  async *pull(name: string, options?: CallOptions): AsyncGenerator<PullProgress> {
    const response = await this.send("POST", "/api/pull", { name, stream: true }, options);
    try {
      for await (const line of lines(abortable(response.body, options?.signal, this.transport.description))) {
        if (!line) continue;
        const event = JSON.parse(line);
        if ("error" in event) throw ZenedgeError.fromBody(200, event);
        yield event as PullProgress;
      }
    } finally {
      response.cancel();
    }
  }

  // -- plumbing ------------------------------------------------------------------------------
  private async send(method: Method, path: string, body: unknown, options?: CallOptions): Promise<TransportResponse> {
    const headers: Record<string, string> = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await this.transport.request({
      method, path, headers, body: body === undefined ? undefined : JSON.stringify(body), signal: options?.signal,
    });
    if (response.status >= 400) {
      const text = await readAll(response);
      let parsed: unknown = text;
      try { parsed = JSON.parse(text); } catch { /* not JSON: reported as such */ }
      const retry = Number(response.headers["retry-after"]);
      throw ZenedgeError.fromBody(response.status, parsed, Number.isFinite(retry) ? retry : undefined);
    }
    return response;
  }

  private async json<T>(method: Method, path: string, body?: unknown, options?: CallOptions): Promise<T> {
    const response = await this.send(method, path, body, options);
    const text = await readAll(response);
    try {
      return JSON.parse(text) as T;
    } catch (error) {
      throw new DaemonUnavailable(this.transport.description, `the answer was cut short (${String(error)})`);
    }
  }

  private async *events<T>(path: string, body: unknown, options?: CallOptions): AsyncGenerator<T> {
    const response = await this.send("POST", path, body, options);
    try {
      for await (const data of sseData(abortable(response.body, options?.signal, this.transport.description))) {
        if (data === "[DONE]") return;
        const event = JSON.parse(data);
        if (event && typeof event === "object" && "error" in event) throw ZenedgeError.fromBody(200, event);
        yield event as T;
      }
      throw new DaemonUnavailable(this.transport.description, "the stream ended without [DONE]");
    } finally {
      response.cancel();  // no-op after [DONE]; otherwise this is what cancels the generation
    }
  }
}

/** The body's chunks, with failures made uniform across transports: the caller's abort is its
 * signal's reason (an AbortError; node:http would say "aborted"), a broken connection is
 * DaemonUnavailable. */
async function* abortable(chunks: AsyncIterable<Uint8Array>, signal: AbortSignal | undefined,
  where: string): AsyncGenerator<Uint8Array> {
  try {
    yield* chunks;
  } catch (error) {
    if (signal?.aborted) throw signal.reason ?? error;
    throw error instanceof ZenedgeError ? error : new DaemonUnavailable(where, error);
  }
}

async function readAll(response: TransportResponse): Promise<string> {
  const decoder = new TextDecoder();
  let text = "";
  for await (const chunk of response.body) text += decoder.decode(chunk, { stream: true });
  return text + decoder.decode();
}
