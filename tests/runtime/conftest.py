import pytest
import torch

from zenedge import config, policy
from zenedge.runtime.engine import Engine


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "config" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[runtime]\ndevice = "cpu"\ndtype = "float32"\nweights = "full"\n')
    return config.load(path)


@pytest.fixture
def engine(store, cfg):
    torch.manual_seed(0)
    return Engine(store, cfg)


@pytest.fixture
def peft_adapter(tiny_base_dir, tmp_path):
    """A real PEFT LoRA adapter with non-zero B (PEFT initialises B to zero), saved by PEFT."""

    def make(seed: int, targets=("q_proj", "k_proj", "v_proj", "o_proj"), r: int = 4, alpha: int = 8,
             rslora: bool = False):
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
    def make(name: str, seed: int, **kwargs):
        policy.import_lora(store, cfg, peft_adapter(seed, **kwargs), name, base="tiny")
        return name

    return make
