"""`zenedge serve`: the local daemon (FastAPI on uvicorn) behind a Unix socket and optional loopback TCP.

Modules, one job each: `settings` (what a daemon was started with), `instance` (one daemon per
home, stale sockets), `listeners` (binding), `security` (Host/Origin/token/body-size middleware),
`errors` (the one exception → HTTP mapping), `scheduler` (queue + batching worker),
`streaming` (SSE/NDJSON), `openai_routes` / `native_routes`, `background` (the background loop:
config reload, pool maintenance), `state` (what the routes share), `app`, `schema` (OpenAPI export), `daemon`.
Importing this package is free: only `daemon` and `app` pull in FastAPI, uvicorn and torch.
"""
