"""`zenedge export`: the pool as files that multi-adapter engines serve (vLLM `--enable-lora`,
LoRAX, Ray Serve LLM all take one PEFT directory per adapter).

- LoRA and merged adapters → one PEFT directory per stored adapter, named after its first
  profile; every other profile it serves gets a directory name too (a symlink), and the
  manifest maps profile → directory.
- BitDelta variants → `hf-merged`: a full Hugging Face model directory with W_base + α⊙sign(Δ)
  (the base's config and tokenizer), or `--bitdelta-as lora`: a rank-r LoRA approximation by
  truncated SVD of α⊙S, with its relative error reported.
- `--format hf-merged`: every profile as a full merged model (W_base + s·B·A for LoRA), for
  engines without adapter support (llama.cpp's converter, plain `from_pretrained`).
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterator

from zenedge.errors import InvalidInput, ZenedgeError
from zenedge.store import Store

MANIFEST = "zenedge-export.json"


def hub_id(store: Store, base: str) -> str:
    """The name engines know the base by: its Hugging Face repo id alias when it has one."""
    row = store.base(base) or {}
    return next((a for a in row.get("aliases", []) if "/" in a), base)


def _peft_dir(store: Store, adapter: dict[str, Any], dest: Path, base_id: str) -> None:
    """The stored file as it is when it is a plain PEFT file; a quantized one (int8/int4,
    storage.py) dequantized into bf16, which every engine that takes PEFT adapters loads."""
    from zenedge.adapters.lora_tensors import stored_format
    from zenedge.adapters.storage import QUANTIZED

    weights = store.verified_blob(adapter["sha256"])
    if stored_format(weights) in QUANTIZED:
        import torch

        from zenedge.adapters.lora_tensors import read_lora_factors, write_peft_adapter

        factors = read_lora_factors(weights, adapter["config"], dtype=torch.float32)
        config = write_peft_adapter(factors, dest, base_model=base_id, storage_format="bf16")
        (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
        return
    dest.mkdir(parents=True, exist_ok=True)
    config = dict(adapter["config"])
    config["base_model_name_or_path"] = base_id
    config.setdefault("task_type", "CAUSAL_LM")
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    shutil.copyfile(weights, dest / "adapter_model.safetensors")


def _module_deltas(store: Store, adapter: dict[str, Any]) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(module, () → dense fp32 ΔW) for a stored variant: each ΔW is built only when it is applied."""
    if adapter["kind"] == "bitdelta":
        from zenedge.bitdelta import decompress, load_bitdelta

        delta = load_bitdelta(store.verified_blob(adapter["sha256"]))
        for module, (packed, alpha, in_features) in delta.modules.items():
            yield module, lambda p=packed, a=alpha, n=in_features: decompress(p, a, n)
    else:
        import torch

        from zenedge.adapters.lora_tensors import read_lora_factors

        factors = read_lora_factors(store.verified_blob(adapter["sha256"]), adapter["config"], dtype=torch.float32)
        for module, f in factors.items():
            yield module, f.delta


def _merged_model(store: Store, adapter: dict[str, Any], dest: Path) -> None:
    """A Hugging Face model directory holding W_base + ΔW, with the base's config and tokenizer."""
    from safetensors.torch import load_file, save_file

    base = store.base(adapter["base"])
    base_dir = store.home / base["dir"]
    if not any(base_dir.glob("*.safetensors")):
        from zenedge.errors import InvalidInput

        raise InvalidInput(f"base {base['name']!r} is stored as a GGUF file: merged exports need its safetensors",
                           hint="export as PEFT adapters instead, or add the base from a Hugging Face directory")
    dest.mkdir(parents=True, exist_ok=True)
    for item in base_dir.iterdir():
        if item.is_file() and not item.name.endswith(".safetensors"):
            shutil.copyfile(item, dest / item.name)
    deltas = dict(_module_deltas(store, adapter))
    for weights in sorted(base_dir.glob("*.safetensors")):
        tensors = load_file(weights)
        for module, delta in deltas.items():
            key = f"{module}.weight"
            if key in tensors:  # summed in fp32, then back to the checkpoint's dtype
                w = tensors[key]
                tensors[key] = (w.float() + delta()).to(w.dtype).contiguous()
        save_file(tensors, str(dest / weights.name), metadata={"format": "pt"})
        del tensors


def _bitdelta_lora(store: Store, adapter: dict[str, Any], dest: Path, rank: int, base_id: str) -> float:
    """Truncated SVD of α⊙S per module as a PEFT LoRA; returns the overall relative error."""
    import torch

    from zenedge.adapters.lora_tensors import write_peft_adapter
    from zenedge.bitdelta import decompress, load_bitdelta
    from zenedge.merge import LoraFactors

    delta = load_bitdelta(store.verified_blob(adapter["sha256"]))
    factors, err2, total2 = {}, 0.0, 0.0
    for module, (packed, alpha, in_features) in delta.modules.items():
        full = decompress(packed, alpha, in_features).double()  # one module at a time
        U, S, Vh = torch.linalg.svd(full, full_matrices=False)
        k = min(rank, S.numel())
        root = S[:k].sqrt()
        factors[module] = LoraFactors((root[:, None] * Vh[:k]).float(), (U[:, :k] * root).float())
        err2 += float(S[k:].square().sum())
        total2 += float(S.square().sum())
    write_peft_adapter(factors, dest, base_model=base_id)
    return (err2 / total2) ** 0.5 if total2 else 0.0


def export(store: Store, dest: Path, names: list[str] | None = None, *, format: str = "peft",
           bitdelta_as: str = "hf-merged", rank: int = 64) -> dict[str, Any]:
    if format not in ("peft", "hf-merged"):
        raise InvalidInput("--format must be peft or hf-merged")
    if bitdelta_as not in ("hf-merged", "lora"):
        raise InvalidInput("--bitdelta-as must be hf-merged or lora")
    dest = Path(dest)
    wanted = names or [row["name"] for row in store.names()]
    by_adapter: dict[str, list[str]] = {}
    for name in wanted:  # every name resolved before anything is written
        by_adapter.setdefault(store.resolve(name)["id"], []).append(name)
    try:
        with _undone_on_failure(dest):
            return _write(store, dest, by_adapter, format, bitdelta_as, rank)
    except OSError as exc:  # a destination we cannot write (read-only, not a directory, disk full)
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(dest) else ""
        raise ZenedgeError(f"cannot write the export to {dest}: {exc.strerror or exc}{where}") from None


@contextmanager
def _undone_on_failure(dest: Path) -> Iterator[None]:
    """A failed (or interrupted) export leaves nothing it created: `dest` with the parents it had
    to make, or, in a folder that was already there, the entries it added. Nothing that existed
    before is deleted (a file it overwrote in such a folder stays overwritten)."""
    made = None   # the topmost folder of `dest` that does not exist yet
    for folder in (dest, *dest.parents):
        if os.path.lexists(folder):
            break
        made = folder
    before = set(os.listdir(dest)) if made is None and dest.is_dir() else None
    try:
        yield
    except BaseException:
        with suppress(OSError):   # the export's own error is the one to report
            if made is not None:
                shutil.rmtree(made)
            elif before is not None:
                for added in (dest / name for name in set(os.listdir(dest)) - before):
                    if added.is_dir() and not added.is_symlink():
                        shutil.rmtree(added)
                    else:
                        added.unlink()
        raise


def _write(store: Store, dest: Path, by_adapter: dict[str, list[str]], format: str, bitdelta_as: str,
           rank: int) -> dict[str, Any]:
    dest.mkdir(parents=True, exist_ok=True)
    entries = []
    for adapter_id, served in by_adapter.items():
        adapter = store.adapter(adapter_id)
        members = store.names_of(adapter_id)
        folder = served[0]
        base_id = hub_id(store, adapter["base"])
        entry: dict[str, Any] = {"dir": folder, "kind": adapter["kind"], "base": adapter["base"],
                                 "base_model": base_id, "serves": members}
        if format == "hf-merged":
            _merged_model(store, adapter, dest / folder)
            entry["format"] = "hf-merged"
        elif adapter["kind"] in ("lora", "merged"):
            _peft_dir(store, adapter, dest / folder, base_id)
            entry["format"], entry["rank"] = "peft", adapter["rank"]
        elif bitdelta_as == "lora":
            entry["format"], entry["rank"] = "peft", rank
            entry["relative_error"] = _bitdelta_lora(store, adapter, dest / folder, rank, base_id)
            entry["note"] = f"rank-{rank} SVD approximation of the 1-bit delta"
        else:
            _merged_model(store, adapter, dest / folder)
            entry["format"] = "hf-merged"
        for alias in members:  # one directory name per profile (Ray Serve addresses adapters by folder)
            if alias != folder and not (dest / alias).exists():
                (dest / alias).symlink_to(folder, target_is_directory=True)
        entries.append(entry)
    manifest = {"format": "zenedge-export/1", "adapters": entries,
                "aliases": {name: e["dir"] for e in entries for name in e["serves"]},
                "serve": serve_hints(dest, entries)}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def serve_hints(dest: Path, entries: list[dict[str, Any]]) -> dict[str, str]:
    loras = [e for e in entries if e["format"] == "peft"]
    if not loras:
        return {}
    base = loras[0]["base_model"]
    modules = " ".join(f"{name}={dest.resolve() / name}" for e in loras for name in e["serves"])
    needed = max(e["rank"] for e in loras)
    rank = next(r for r in (8, 16, 32, 64, 128, 256, 512) if r >= needed)  # vLLM's allowed values
    return {"vllm": f"vllm serve {base} --enable-lora --max-loras {len(loras)} --max-lora-rank {rank} "
                    f"--lora-modules {modules}"}
