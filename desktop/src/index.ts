/**
 * @zenedge/client: talk to a local zenedge daemon. This entry point has no Node imports and runs in
 * a Tauri webview (FetchTransport over loopback TCP + token); `@zenedge/client/node` adds the Unix
 * socket, discovery of a running daemon and spawning one.
 */

export { ZenedgeClient, type CallOptions } from "./client.js";
export { DaemonUnavailable, ZenedgeError } from "./errors.js";
export { lines, sseData } from "./lines.js";
export { FetchTransport, type Transport, type TransportRequest, type TransportResponse } from "./transport.js";
export type * from "./wire.js";
