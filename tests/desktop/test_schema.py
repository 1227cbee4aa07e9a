"""desktop/openapi.json and the clients' generated types are what the server and the generator
produce now: a change to the wire contract reaches the desktop clients, or this fails."""

from __future__ import annotations

import importlib.util
import json

from tests.conftest import REPO
from zenedge.server import schema

DESKTOP = REPO / "desktop"
REFRESH = "python -m zenedge.server.schema desktop/openapi.json && python desktop/tools/gen_types.py"


def generator():
    spec = importlib.util.spec_from_file_location("gen_types", DESKTOP / "tools" / "gen_types.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_openapi_schema_is_current():
    assert (DESKTOP / "openapi.json").read_text(encoding="utf-8") == schema.render(), f"run: {REFRESH}"


def test_generated_client_types_are_current():
    spec = json.loads((DESKTOP / "openapi.json").read_text(encoding="utf-8"))
    for path, text in generator().outputs(spec).items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is stale; run: {REFRESH}"


def test_schema_covers_every_endpoint_and_streamed_type():
    spec = schema.openapi()
    assert set(spec["paths"]) == {"/health", "/v1/models", "/v1/models/{model}", "/v1/chat/completions",
                                  "/v1/completions", "/v1/responses",
                                  "/v1/embeddings", "/api/pull", "/api/list", "/api/ps", "/api/rm", "/api/budget",
                                  "/api/pool", "/api/tags", "/api/show", "/api/version", "/api/chat",
                                  "/api/generate", "/api/embed", "/api/embeddings", "/api/delete", "/api/stop", "/api/import",
                                  "/api/pin", "/api/merge", "/api/compress"}
    schemas = spec["components"]["schemas"]
    assert {"ChatCompletionChunk", "PullProgress", "ErrorBody", "OllamaChatResponse", "OllamaGenerateResponse",
            "OllamaError"} <= set(schemas)
    assert "HTTPValidationError" not in schemas  # validation errors use ErrorBody like every other error
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert chat["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert chat["200"]["content"]["text/event-stream"]["schema"]["$ref"].endswith("/ChatCompletionChunk")
    ollama_chat = spec["paths"]["/api/chat"]["post"]["responses"]  # Ollama's routes answer Ollama's error body
    assert ollama_chat["404"]["content"]["application/json"]["schema"]["$ref"].endswith("/OllamaError")
    assert ollama_chat["200"]["content"]["application/x-ndjson"]["schema"]["$ref"].endswith("/OllamaChatResponse")
