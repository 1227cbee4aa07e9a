"""The quality gate: how much of each member's gain a merged adapter keeps.

For a member with an eval set, retention = (L_base − L_merged) / (L_base − L_member), with L the
teacher-forced answer loss on the member's own eval set, measured on the real base. Each
profile's L_base and L_member are measured once (when it is first needed, while its own adapter
still exists) and stored with its name, because the original adapter is gone after a merge.

For a member WITHOUT an eval set, a data-free proxy: on fixed generic prompts, retention =
1 − KL(p_current ‖ p_merged) / KL(p_current ‖ p_base), where p_current is the adapter serving
the member now. It measures how much of the member's departure from the base survives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zenedge.evaluation import answer_loss, encode_examples, load_eval_set
from zenedge.runtime.model import ResidentModel
from zenedge.runtime.variants import Variant

MAX_EXAMPLES = 64          # enough for a stable mean loss, cheap enough to run per merge attempt
MAX_LEN = 384
GAIN_EPS = 1e-3            # below this, the member did not improve on the base: nothing to keep
GENERIC_PROMPTS = [
    "Tell me about your day.", "What is the capital of Italy?", "Write one sentence about rain.",
    "How do I boil an egg?", "List three colours.", "Explain what a computer is.",
    "What is 12 plus 30?", "Describe a cat in five words.",
]


def retention(base_loss: float, own_loss: float, merged_loss: float) -> float:
    """Fraction of the member's loss improvement the merged adapter keeps (can be < 0 or > 1)."""
    gain = base_loss - own_loss
    if gain < GAIN_EPS:  # the adapter never helped on its own set: only ask that merging not hurt
        return 1.0 if merged_loss <= max(base_loss, own_loss) + GAIN_EPS else 0.0
    return (base_loss - merged_loss) / gain


@dataclass
class Measurement:
    name: str
    metric: str              # "loss" | "proxy"
    retention: float
    merged_loss: float | None = None


class QualityGate:
    def __init__(self, resident: ResidentModel, batch_size: int = 16):
        self.resident = resident
        self.batch_size = batch_size
        self._encoded: dict[str, list] = {}

    # -- measurements ----------------------------------------------------------------------
    def encoded(self, eval_path: Path) -> list:
        key = str(eval_path)
        if key not in self._encoded:
            examples = load_eval_set(eval_path)[:MAX_EXAMPLES]
            self._encoded[key] = encode_examples(self.resident.tokenizer, examples, MAX_LEN)
        return self._encoded[key]

    def loss(self, variant: Variant | None, eval_path: Path) -> float:
        pad = self.resident.tokenizer.pad_token_id or 0
        # Teacher-forced scoring reads text like a prefill: on the plain weights (runtime/layers.py),
        # 2× faster than int4 at these lengths and the numbers anchors were stored with before.
        with self.resident.state.using([variant], plain=True):
            return answer_loss(self.resident.model, self.encoded(eval_path), self.batch_size, pad)

    def anchors(self, own: Variant | None, eval_path: Path) -> dict[str, Any]:
        """The numbers a profile's later gates compare against (stored with its name)."""
        return {"metric": "loss", "base_loss": self.loss(None, eval_path), "own_loss": self.loss(own, eval_path),
                "examples": len(self.encoded(eval_path))}

    @torch.no_grad()
    def _log_probs(self, variant: Variant | None) -> torch.Tensor:
        tokenizer = self.resident.tokenizer
        rows = []
        for prompt in GENERIC_PROMPTS:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            with self.resident.state.using([variant], plain=True):
                logits = self.resident.model(input_ids=torch.tensor([ids], device=self.resident.device)).logits
            rows.append(torch.log_softmax(logits[0].float(), dim=-1))
        return torch.cat(rows)  # [tokens, V]

    def proxy(self, current: Variant | None, merged: Variant) -> float:
        p = self._log_probs(current)
        kl = lambda q: float((p.exp() * (p - q)).sum(-1).mean())
        drift = kl(self._log_probs(None))
        if drift < 1e-6:
            return 1.0
        return max(0.0, 1.0 - kl(self._log_probs(merged)) / drift)

    # -- the gate ----------------------------------------------------------------------------
    def measure(self, name: str, quality: dict[str, Any], eval_path: Path | None, merged: Variant,
                current: Variant | None) -> Measurement:
        if eval_path is not None and quality.get("metric") == "loss":
            merged_loss = self.loss(merged, eval_path)
            value = retention(quality["base_loss"], quality["own_loss"], merged_loss)
            return Measurement(name, "loss", value if math.isfinite(value) else 0.0, merged_loss)
        return Measurement(name, "proxy", self.proxy(current, merged))
