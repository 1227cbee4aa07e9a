"""The daemon's OpenAPI schema, as committed in desktop/openapi.json (the desktop clients' types are
generated from it by desktop/tools/gen_types.py).

    python -m zenedge.server.schema desktop/openapi.json && python desktop/tools/gen_types.py

Streamed bodies (SSE chunks, NDJSON progress, error events) are not whole responses, so FastAPI
would leave them out; they are added to `components.schemas` here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic.json_schema import models_json_schema

from zenedge.api import wire
from zenedge.server.settings import Settings


def openapi() -> dict[str, Any]:
    from zenedge.server.app import create_app

    settings = Settings(home=Path("."), config_path=Path("config.toml"), socket=Path("zenedge.sock"),
                        socket_is_default=True)
    # Routes only touch the state when they serve a request; building the schema needs none.
    app = create_app(SimpleNamespace(settings=settings, cfg=None, engine=None, activity=None), background=None)
    schema = app.openapi()
    _, extra = models_json_schema([(model, "serialization") for model in wire.STREAMED],
                                  ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in extra.get("$defs", {}).items():
        components.setdefault(name, definition)
    schema["components"]["schemas"] = dict(sorted(components.items()))
    return schema


def render() -> str:
    return json.dumps(openapi(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m zenedge.server.schema OUTPUT.json", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
