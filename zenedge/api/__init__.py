"""The daemon's wire contract and the clients that speak it.

- `wire`: request/response types (pydantic). The server validates with them, its OpenAPI schema
  (committed as desktop/openapi.json) is generated from them, and the desktop clients' types are
  generated from that schema. Importing it costs pydantic, so the CLI does not.
- `discovery`: where a daemon listens (socket path, token file, daemon.json); stdlib only.
- `client`: the CLI's daemon client over http.client (stdlib only: `zenedge run` through a daemon
  must not pay for httpx or pydantic); the transport (Unix socket or TCP + token) is injected.
"""
