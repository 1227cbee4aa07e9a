"""The ASGI application: routes, the security middleware stack, the error mapping."""

from __future__ import annotations

from fastapi import FastAPI

from zenedge import __version__
from zenedge.api import wire
from zenedge.runtime.embed import Embedder
from zenedge.server import errors, native_routes, ollama_routes, openai_routes, responses_routes
from zenedge.server.background import Background
from zenedge.server.idle import CountRequests
from zenedge.server.security import BodyLimit, LocalOnly, TokenAuth
from zenedge.server.state import DaemonState

ERROR_RESPONSES = {status: {"model": wire.ErrorBody, "description": what} for status, what in {
    400: "malformed request", 401: "missing or wrong bearer token (TCP)", 403: "foreign Host or Origin",
    404: "unknown model, profile or endpoint", 413: "request body too large", 422: "request does not fit the schema",
    503: "queue full (see Retry-After) or shutting down"}.items()}


def create_app(state: DaemonState, background: Background) -> FastAPI:
    settings = state.settings
    app = FastAPI(title="zenedge", version=__version__, docs_url=None, redoc_url=None,
                  responses=ERROR_RESPONSES,
                  description="Local daemon for families of fine-tuned LLM variants: OpenAI-compatible /v1, "
                              "native /api and Ollama-compatible /api endpoints. See desktop/README.md.")
    embedder = Embedder(state.engine)  # one per daemon: its embedding batches run one at a time
    app.include_router(native_routes.router(state, background))
    app.include_router(openai_routes.router(state, embedder))
    app.include_router(responses_routes.router(state))
    app.include_router(ollama_routes.router(state, embedder))
    errors.install(app)
    # add_middleware wraps: the last one added runs first. Order of checks: Host/Origin, token, size.
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(TokenAuth, token=settings.token,
                       loopback_is_trusted=lambda: state.cfg.server.tcp_auth == "loopback")
    extra_hosts = []
    if settings.tcp and settings.allow_remote:  # a remote client names the address it reached
        host = settings.tcp[0]
        extra_hosts = [f"[{host}]" if ":" in host else host]
    app.add_middleware(LocalOnly, origins=lambda: state.cfg.server.cors_origins, extra_hosts=extra_hosts)
    app.add_middleware(CountRequests, activity=state.activity)  # outermost: a refused request is activity too
    return app
