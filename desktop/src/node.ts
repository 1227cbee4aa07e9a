/**
 * Node-only parts: the Unix socket transport, finding a running daemon, and starting one.
 *
 * Discovery follows the daemon's own rules: the home is ZENEDGE_HOME or platformdirs' user data dir
 * for "zenedge"; a running daemon describes itself in `<home>/daemon.json` (socket path, TCP address,
 * pid); the TCP token is ZENEDGE_TOKEN or `<home>/token`.
 */

import { spawn as spawnProcess, type SpawnOptions } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { request as httpRequest, type IncomingMessage } from "node:http";
import { homedir, platform } from "node:os";
import { join } from "node:path";

import { ZenedgeClient } from "./client.js";
import { DaemonUnavailable, ZenedgeError } from "./errors.js";
import type { Transport, TransportRequest, TransportResponse } from "./transport.js";

export * from "./index.js";

export type NodeTarget = { socketPath: string } | { host: string; port: number; token: string };

/** node:http over the Unix socket (no token: the socket's 0600 mode is the credential) or TCP + token. */
export class NodeTransport implements Transport {
  readonly description: string;

  constructor(private readonly target: NodeTarget) {
    this.description = "socketPath" in target ? `unix:${target.socketPath}` : `http://${target.host}:${target.port}`;
  }

  request(request: TransportRequest): Promise<TransportResponse> {
    const target = this.target;
    const headers: Record<string, string> = { ...request.headers };
    if ("token" in target) headers.Authorization = `Bearer ${target.token}`;
    if (request.body !== undefined) headers["Content-Length"] = String(Buffer.byteLength(request.body));
    return new Promise((resolve, reject) => {
      const outgoing = httpRequest({
        ...("socketPath" in target ? { socketPath: target.socketPath, host: "localhost" } : { host: target.host, port: target.port }),
        method: request.method, path: request.path, headers, signal: request.signal,
      }, (incoming: IncomingMessage) => {
        const collected: Record<string, string> = {};
        for (const [key, value] of Object.entries(incoming.headers)) {
          if (value !== undefined) collected[key.toLowerCase()] = Array.isArray(value) ? value.join(", ") : value;
        }
        resolve({ status: incoming.statusCode ?? 0, headers: collected, body: incoming, cancel: () => outgoing.destroy() });
      });
      outgoing.on("error", (error) => reject(request.signal?.aborted ? error : new DaemonUnavailable(this.description, error)));
      outgoing.end(request.body);
    });
  }
}

/** platformdirs' user_data_dir("zenedge"), or ZENEDGE_HOME. */
export function defaultHome(env: NodeJS.ProcessEnv = process.env): string {
  if (env.ZENEDGE_HOME) return env.ZENEDGE_HOME;
  switch (platform()) {
    case "darwin": return join(homedir(), "Library", "Application Support", "zenedge");
    case "win32": return join(env.LOCALAPPDATA ?? join(homedir(), "AppData", "Local"), "zenedge", "zenedge");
    default: return join(env.XDG_DATA_HOME || join(homedir(), ".local", "share"), "zenedge");
  }
}

export interface DaemonInfo {
  pid: number;
  version: string;
  socket: string;
  tcp: string | null;
  home_id: string;
  started_at: number;
}

export function readDaemonInfo(home: string = defaultHome()): DaemonInfo | null {
  try {
    return JSON.parse(readFileSync(join(home, "daemon.json"), "utf8")) as DaemonInfo;
  } catch {
    return null;
  }
}

export function readToken(home: string = defaultHome(), env: NodeJS.ProcessEnv = process.env): string | null {
  if (env.ZENEDGE_TOKEN) return env.ZENEDGE_TOKEN;
  try {
    return readFileSync(join(home, "token"), "utf8").trim() || null;
  } catch {
    return null;
  }
}

function splitAddress(address: string): { host: string; port: number } {
  const at = address.lastIndexOf(":");
  return { host: address.slice(0, at).replace(/^\[|\]$/g, ""), port: Number(address.slice(at + 1)) };
}

export interface DiscoverOptions {
  home?: string;
  /** Use the TCP listener even when the socket is reachable (what a webview would do). */
  preferTcp?: boolean;
  timeoutMs?: number;
}

/** A client for the daemon already running for `home`, or null. Checks /health before answering. */
export async function discover(options: DiscoverOptions = {}): Promise<ZenedgeClient | null> {
  const home = options.home ?? defaultHome();
  const info = readDaemonInfo(home);
  if (!info) return null;
  const candidates: Transport[] = [];
  if (!options.preferTcp && info.socket && existsSync(info.socket)) candidates.push(new NodeTransport({ socketPath: info.socket }));
  const token = readToken(home);
  if (info.tcp && token) candidates.push(new NodeTransport({ ...splitAddress(info.tcp), token }));
  for (const transport of candidates) {
    const client = new ZenedgeClient(transport);
    try {
      const health = await client.health({ signal: AbortSignal.timeout(options.timeoutMs ?? 2000) });
      if (health.pid === info.pid) return client;
    } catch {
      // stale daemon.json or socket: try the next, then report none
    }
  }
  return null;
}

export interface EnsureOptions extends DiscoverOptions {
  /** The zenedge executable (default "zenedge"; a Tauri sidecar path in an app). */
  command?: string;
  args?: string[];
  env?: NodeJS.ProcessEnv;
  /** How long to wait for a spawned daemon to answer (the first start loads torch: seconds). */
  startTimeoutMs?: number;
  spawn?: typeof spawnProcess;
}

/** The running daemon, or a new one spawned detached (it outlives this process, like Ollama's). */
export async function ensureDaemon(options: EnsureOptions = {}): Promise<ZenedgeClient> {
  const found = await discover(options);
  if (found) return found;
  const env = { ...process.env, ...options.env, ...(options.home ? { ZENEDGE_HOME: options.home } : {}) };
  const spawnOptions: SpawnOptions = { detached: true, stdio: "ignore", env };
  const child = (options.spawn ?? spawnProcess)(options.command ?? "zenedge", options.args ?? ["serve"], spawnOptions);
  let exited: number | null = null;
  let spawnError: Error | null = null;
  child.on("exit", (code) => { exited = code ?? -1; });
  child.on("error", (error) => { spawnError = error; });
  child.unref();
  const deadline = Date.now() + (options.startTimeoutMs ?? 120_000);
  while (Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 200));
    if (spawnError) throw new ZenedgeError(`cannot start the zenedge daemon: ${(spawnError as Error).message}`, 0, "unavailable");
    const client = await discover({ ...options, home: env.ZENEDGE_HOME ?? options.home });
    if (client) return client;  // ours, or one that won a race with it (then ours exited: one per home)
    if (exited !== null && exited !== 0 && !readDaemonInfo(env.ZENEDGE_HOME ?? defaultHome())) {
      throw new ZenedgeError(`the zenedge daemon exited with status ${exited}`, 0, "unavailable",
        "run `zenedge serve` in a terminal to see why");
    }
  }
  throw new ZenedgeError("the zenedge daemon did not answer in time", 0, "unavailable");
}
