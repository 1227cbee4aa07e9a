/**
 * Transports carry one HTTP exchange to the daemon. The client knows the endpoints; the transport
 * knows where the bytes go. `FetchTransport` (here) works in Node 20 and in a Tauri webview over
 * loopback TCP with the bearer token; `NodeTransport` (./node.ts) also speaks over the Unix socket.
 */

import { DaemonUnavailable } from "./errors.js";

export interface TransportRequest {
  method: "GET" | "POST" | "PUT";
  path: string;
  headers: Record<string, string>;
  body?: string;
  signal?: AbortSignal;
}

export interface TransportResponse {
  status: number;
  /** Header names in lower case. */
  headers: Record<string, string>;
  body: AsyncIterable<Uint8Array>;
  /** Stop reading and close the connection: the daemon cancels the generation behind it. */
  cancel(): void;
}

export interface Transport {
  readonly description: string;
  request(request: TransportRequest): Promise<TransportResponse>;
}

/** Loopback TCP through `fetch` (Node 20's built-in, or a webview's). */
export class FetchTransport implements Transport {
  readonly description: string;
  private readonly base: string;

  constructor(baseUrl: string, private readonly token: string | undefined, private readonly fetchImpl: typeof fetch = globalThis.fetch) {
    this.base = baseUrl.replace(/\/+$/, "");
    this.description = this.base;
  }

  async request(request: TransportRequest): Promise<TransportResponse> {
    const controller = new AbortController();
    const abort = () => controller.abort();
    request.signal?.addEventListener("abort", abort, { once: true });
    const headers = { ...request.headers, ...(this.token ? { Authorization: `Bearer ${this.token}` } : {}) };
    let response: Response;
    try {
      response = await this.fetchImpl(this.base + request.path, {
        method: request.method, headers, body: request.body, signal: controller.signal,
      });
    } catch (error) {
      request.signal?.removeEventListener("abort", abort);
      if (request.signal?.aborted) throw error;
      throw new DaemonUnavailable(this.description, (error as { cause?: unknown }).cause ?? error);
    }
    const collected: Record<string, string> = {};
    response.headers.forEach((value, key) => { collected[key.toLowerCase()] = value; });
    return {
      status: response.status,
      headers: collected,
      body: readBody(response),
      cancel: () => {
        request.signal?.removeEventListener("abort", abort);
        controller.abort();
      },
    };
  }
}

async function* readBody(response: Response): AsyncGenerator<Uint8Array> {
  if (!response.body) return;
  const reader = response.body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  } finally {
    reader.releaseLock();
  }
}
