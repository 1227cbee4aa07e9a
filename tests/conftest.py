"""Shared fixtures. Every test gets its own ZENEDGE_HOME and ZENEDGE_CONFIG: no test touches a real home."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
# `pull` and `run` start a background daemon unless told not to (server.keep_alive): a test's CLI
# subprocess must not leave one behind. The tests of that start set this themselves.
os.environ["ZENEDGE_KEEP_ALIVE"] = "0"
TINY_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("ZENEDGE_HOME", str(home))
    monkeypatch.setenv("ZENEDGE_CONFIG", str(tmp_path / "config" / "config.toml"))
    monkeypatch.delenv("ZENEDGE_TOKEN", raising=False)
    return home


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory) -> Path:
    """A tiny random llama saved as a Hugging Face directory (config.json + safetensors)."""
    return make_tiny_base(tmp_path_factory.mktemp("tiny-base"))


def make_tiny_base(path: Path, positions: int = 128, tied: bool = True) -> Path:
    """Write the tiny random llama into `path` (also used outside pytest, by tests/faults.py)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=positions,
                         tie_word_embeddings=tied)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, 0
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = 2
    model.save_pretrained(path, safe_serialization=True)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def real_base_dir(tmp_path_factory):
    """The real default base converted to a Hugging Face directory, once per test session (~20 s)."""
    from zenedge import bases

    try:
        gguf = bases.default_base_gguf()
    except Exception as exc:  # the README's set-up installs it; say so instead of erroring obscurely
        pytest.fail(f"the default base is not installed: {exc}")
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    bases.convert_gguf(gguf, out)
    return out


def tiny_tokenizer():
    """A character-level tokenizer with a ChatML template: enough to exercise chat encoding,
    incremental detokenisation and stop strings without any downloaded vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(specials + chars)},
                                      unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tokenizer


def tiny_module_shapes(base_dir: Path) -> dict[str, tuple[int, int]]:
    from zenedge.bases import linear_modules

    return {m: tuple(s) for m, s in linear_modules(base_dir).items()}


def write_lora_dir(path: Path, shapes: dict[str, tuple[int, int]], *, rank: int = 4, alpha: int = 8,
                   seed: int = 0, targets=TINY_MODULES, dtype=np.float32, scale: float = 0.05) -> Path:
    """Write a LoRA directory in exactly PEFT's save_pretrained format, quickly (numpy, no torch)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    modules = sorted(m for m in shapes if m.rsplit(".", 1)[-1] in targets)
    for module in modules:
        out_f, in_f = shapes[module]
        tensors[f"base_model.model.{module}.lora_A.weight"] = (rng.standard_normal((rank, in_f)) * scale).astype(dtype)
        tensors[f"base_model.model.{module}.lora_B.weight"] = (rng.standard_normal((out_f, rank)) * scale).astype(dtype)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "target_modules": list(targets), "lora_dropout": 0.0, "bias": "none",
              "base_model_name_or_path": "tiny", "fan_in_fan_out": False, "use_rslora": False}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def store(isolated_home, tiny_base_dir):
    """A store with the tiny base registered as `tiny`."""
    from zenedge import bases
    from zenedge.store import Store

    s = Store(isolated_home)
    bases.add_hf_dir(s, tiny_base_dir, "tiny")
    return s


@pytest.fixture
def lora_factory(tmp_path, tiny_base_dir):
    shapes = tiny_module_shapes(tiny_base_dir)
    counter = iter(range(10**6))

    def make(**kwargs) -> Path:
        return write_lora_dir(tmp_path / f"lora-{next(counter)}", shapes, **kwargs)

    return make



@pytest.fixture
def cfg(tmp_path):
    """A config for the tiny model: CPU, fp32, full weights, adapters stored as given (the exact
    reference numerics: the default stores float32 adapters as bf16)."""
    from zenedge import config

    path = tmp_path / "config" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[runtime]\ndevice = "cpu"\ndtype = "float32"\nweights = "full"\n[pool]\nstore_dtype = "given"\n')
    return config.load(path)


@pytest.fixture
def engine(store, cfg):
    import torch

    from zenedge.runtime.engine import Engine

    torch.manual_seed(0)
    return Engine(store, cfg)


@pytest.fixture
def peft_adapter(tiny_base_dir, tmp_path):
    """A real PEFT LoRA adapter with non-zero B (PEFT initialises B to zero), saved by PEFT."""

    def make(seed: int, targets=("q_proj", "k_proj", "v_proj", "o_proj"), r: int = 4, alpha: int = 8,
             rslora: bool = False):
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(tiny_base_dir)
        peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                                                      use_rslora=rslora, lora_dropout=0.0))
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_" in name:
                    param.normal_(0, 0.2)
        path = tmp_path / f"peft-{seed}-{r}-{rslora}"
        peft_model.save_pretrained(path)
        return path

    return make


@pytest.fixture
def imported(store, cfg, peft_adapter):
    """Import a PEFT adapter into the test pool under a name."""
    from zenedge import pool

    def make(name: str, seed: int, **kwargs):
        pool.import_lora(store, cfg, peft_adapter(seed, **kwargs), name, base="tiny")
        return name

    return make


def run_cli(*args: str, env: dict | None = None, check: bool = False):
    """Run the real `zenedge` entry point in a subprocess."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "zenedge.cli", *args], capture_output=True, text=True,
                            env={**os.environ, **(env or {})}, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"zenedge {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result
