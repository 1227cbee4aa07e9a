"""How zenedge's bases and profiles look to Ollama's clients: the entries of /api/tags, /api/show
and /api/ps, read from the store and the base's own files (config.json, safetensors headers,
tokenizer_config.json) without loading the model.

A profile is its base plus an adapter: it reports the base's architecture (family, context and
embedding length: a variant changes neither) and says what serves it in `details.parent_model`
and `model_info["zenedge.*"]`. Blocking (SQLite, file reads): routes call these through a thread.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from zenedge import bases
from zenedge.adapters.safetensors_file import read_header
from zenedge.errors import AdapterNotFound
from zenedge.store import Store

CAPABILITIES = ["completion", "embedding"]


@dataclass(frozen=True)
class BaseFacts:
    name: str
    digest: str
    bytes: int
    created_at: float
    family: str              # config.json's model_type, e.g. "llama"
    parameters: int
    dtype: str               # of the stored weights, as Ollama names it ("F32", "BF16")
    context_length: int
    embedding_length: int
    block_count: int
    head_count: int
    template: str            # the chat template

    def details(self, parent: str = "") -> dict[str, Any]:
        return {"parent_model": parent, "format": "safetensors", "family": self.family, "families": [self.family],
                "parameter_size": parameter_size(self.parameters), "quantization_level": self.dtype}


def parameter_size(count: int) -> str:
    """Ollama's style: "135M", "1.7B"."""
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + unit
    return str(count)


def timestamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


@lru_cache(maxsize=16)
def _read_files(directory: str, digest: str) -> dict[str, Any]:
    """What the files say; cached per base directory and content (`digest` keys a re-registered base)."""
    folder = Path(directory)
    config = json.loads((folder / "config.json").read_text())
    parameters, dtypes = 0, {}
    for path in bases.weights_files(folder):
        if path.suffix == ".gguf":          # a GGUF file stored as it is: its tensor table
            from zenedge import gguf_file

            for tensor in gguf_file.reader(path).tensors:
                parameters += int(tensor.n_elements)
                kind = gguf_file.type_name(tensor)
                dtypes[kind] = dtypes.get(kind, 0) + int(tensor.n_elements)
            continue
        for info in read_header(path).tensors.values():
            parameters += info.numel
            dtypes[info.dtype] = dtypes.get(info.dtype, 0) + info.numel
    template = ""
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        path = folder / name
        if path.is_file():
            text = path.read_text()
            template = text if name.endswith(".jinja") else str(json.loads(text).get("chat_template") or "")
            break
    return {"config": config, "parameters": parameters, "dtype": max(dtypes, key=dtypes.get) if dtypes else "",
            "template": template}


def base_facts(store: Store, row: dict[str, Any]) -> BaseFacts:
    files = _read_files(str(store.home / row["dir"]), row["sha256"])
    config = files["config"]
    return BaseFacts(
        name=row["name"], digest=row["sha256"], bytes=row["bytes"], created_at=row["created_at"],
        family=str(config.get("model_type", "unknown")), parameters=files["parameters"], dtype=files["dtype"],
        context_length=int(config.get("max_position_embeddings") or 0),
        embedding_length=int(config.get("hidden_size") or 0), block_count=int(config.get("num_hidden_layers") or 0),
        head_count=int(config.get("num_attention_heads") or 0), template=files["template"])


def _base_row(store: Store, name: str) -> dict[str, Any] | None:
    return store.base(name) or bases.find_base(store, name)


def tags(store: Store) -> list[dict[str, Any]]:
    """Every registered base, then every profile in the pool."""
    facts = {row["name"]: base_facts(store, row) for row in store.bases()}
    entries = [{"name": f.name, "model": f.name, "modified_at": timestamp(f.created_at), "size": f.bytes,
                "digest": f.digest, "details": f.details(), "kind": "base"} for f in facts.values()]
    for row in store.names():
        base = facts.get(row["base"])
        if base is None:  # a profile whose base row is gone: `zenedge pool check` reports it
            continue
        entries.append({"name": row["name"], "model": row["name"], "modified_at": timestamp(row["created_at"]),
                        "size": row["bytes"], "digest": row["adapter_id"], "details": base.details(base.name),
                        "kind": row["kind"]})
    return entries


def show(store: Store, name: str) -> dict[str, Any]:
    """/api/show for a base or a profile; AdapterNotFound (404) for anything else. The embedded
    default base is converted on first use, as a generation would."""
    row = _base_row(store, name)
    profile = None
    if row is None and name == bases.DEFAULT_BASE:
        row = bases.ensure_base(store, name)
    if row is None:
        profile = store.name(name)
        if profile is None:
            raise AdapterNotFound(f"model {name[:80]!r} not found", hint="see GET /api/tags")
        adapter = store.adapter(profile["adapter_id"])
        row = _base_row(store, adapter["base"])
        if row is None:
            raise AdapterNotFound(f"the base {adapter['base']!r} of {name!r} is not registered")
    facts = base_facts(store, row)
    info: dict[str, Any] = {
        "general.architecture": facts.family, "general.parameter_count": facts.parameters,
        f"{facts.family}.context_length": facts.context_length,
        f"{facts.family}.embedding_length": facts.embedding_length,
        f"{facts.family}.block_count": facts.block_count,
        f"{facts.family}.attention.head_count": facts.head_count,
        "zenedge.kind": "base", "zenedge.base": facts.name,
    }
    modified = facts.created_at
    if profile is not None:
        others = [member for member in store.names_of(adapter["id"]) if member != name]  # a merged adapter's
        info.update({"zenedge.kind": adapter["kind"], "zenedge.adapter": adapter["id"],
                     "zenedge.adapter_bytes": adapter["bytes"], "zenedge.served_with": others})
        modified = profile["created_at"]
    return {"license": "", "modelfile": "", "parameters": "", "template": facts.template,
            "details": facts.details(facts.name if profile is not None else ""), "model_info": info,
            "capabilities": CAPABILITIES, "modified_at": timestamp(modified)}


def running(store: Store, engine) -> list[dict[str, Any]]:
    """Ollama's /api/ps entries: the resident bases, then each name a cached variant serves."""
    gpu = engine.device.type != "cpu"
    facts = {}
    entries = []
    for resident in engine.ps()["bases"]:
        row = _base_row(store, resident["name"])
        if row is None:
            continue
        base = facts[resident["name"]] = base_facts(store, row)
        entries.append(_running(resident["name"], base.bytes, base.digest, base.details(), base, gpu))
    for variant in engine.cache.snapshot():
        base = _variant_base(store, variant["key"], facts)
        if base is None:
            continue
        for name in variant["names"]:
            entries.append(_running(name, variant["bytes"], variant["key"], base.details(base.name), base, gpu))
    return entries


def _running(name: str, size: int, digest: str, details: dict, base: BaseFacts, gpu: bool) -> dict[str, Any]:
    return {"name": name, "model": name, "size": size, "digest": digest, "details": details, "expires_at": None,
            "size_vram": size if gpu else 0, "context_length": base.context_length}


def _variant_base(store: Store, adapter_id: str, facts: dict[str, BaseFacts]) -> BaseFacts | None:
    try:
        base = store.adapter(adapter_id)["base"]
    except AdapterNotFound:  # removed from the pool a moment ago; sync_cache drops it next
        return None
    if base not in facts:
        row = _base_row(store, base)
        if row is None:
            return None
        facts[base] = base_facts(store, row)
    return facts[base]

