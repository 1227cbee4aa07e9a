"""What the pool tests share: a config writer and profiles (a LoRA plus an eval set of its own
greedy answers, so it has a gain for the gate to measure)."""

import json

import pytest
import torch

from tests.conftest import tiny_module_shapes, write_lora_dir
from zenedge import config
from zenedge.runtime.engine import Engine, Prompt
from zenedge.runtime.generate import SamplingParams


# Merge and eviction tests size budgets by the fp32 files they import, and test what happens past
# compression: they store adapters as given and never re-store them smaller (test_shrink.py does).
AS_GIVEN = 'store_dtype = "given"\ncompress_to = "off"\n'


def set_config(tmp_path, text, pinned=(), *, as_given=True):
    if as_given:
        text = text.replace("[pool]\n", "[pool]\n" + AS_GIVEN, 1) if "[pool]\n" in text else text + "[pool]\n" + AS_GIVEN
    path = tmp_path / "config" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'[runtime]\ndevice = "cpu"\ndtype = "float32"\nweights = "full"\npinned = {json.dumps(list(pinned))}\n' + text)
    return config.load(path)


@pytest.fixture
def make_profile(tmp_path, tiny_base_dir, store):
    """A LoRA dir plus an eval set made of that adapter's own greedy answers (so it has a gain)."""
    shapes = tiny_module_shapes(tiny_base_dir)
    cfg = set_config(tmp_path, "")

    def make(name, seed, *, like=None, noise=0.0, with_eval=True, examples=12):
        path = tmp_path / f"src-{name}"
        write_lora_dir(path, shapes, seed=seed, rank=4, scale=0.3)
        if like is not None:  # a near-copy of another profile: same factors plus a little noise
            from safetensors.torch import load_file, save_file

            tensors = load_file(like / "adapter_model.safetensors")
            g = torch.Generator().manual_seed(seed)
            save_file({k: v + noise * torch.randn(v.shape, generator=g) for k, v in tensors.items()},
                      str(path / "adapter_model.safetensors"))
        if not with_eval:
            return path, None
        scratch = Engine(store, cfg)
        resident = scratch.resident("tiny")
        from zenedge.adapters.lora_tensors import read_lora_factors
        from zenedge.runtime.variants import Variant

        variant = Variant(name, "lora", read_lora_factors(path / "adapter_model.safetensors",
                                                          json.loads((path / "adapter_config.json").read_text())))
        rows = []
        from zenedge.runtime.generate import GenerationRequest, generate

        for i in range(examples):
            ids = Prompt(messages=[{"role": "user", "content": f"item {i}"}]).encode(resident.tokenizer)
            text = ""
            for deltas in generate(resident, [GenerationRequest(ids, variant, SamplingParams(max_tokens=6))]):
                text += "".join(d.text for d in deltas)
            rows.append({"prompt": f"item {i}", "answer": text.strip() or "x"})
        eval_path = tmp_path / f"{name}.jsonl"
        eval_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path, eval_path

    return make
