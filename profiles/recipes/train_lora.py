"""Train one LoRA profile and write it into the embedded registry.

    python -m profiles.recipes.train_lora writer --steps 200 --lr 5e-4

Writes, under profiles/<task>/: eval.jsonl (held-out, disjoint prompts), adapter/ (PEFT
adapter_config.json + adapter_model.safetensors, tensors in bf16, base_model_name_or_path =
"smollm2-135m") and recipe.json (data, hyper-parameters, s/step, final loss).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from profiles.recipes.card import BASE_NAME, write_recipe
from profiles.recipes.data import TASKS, build_splits, write_jsonl
from profiles.recipes.training import TrainConfig, encode_for_training, train

PROFILES = Path(__file__).resolve().parent.parent
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def save_adapter_bf16(peft_model, out_dir: Path) -> None:
    """PEFT's save_pretrained, then the tensors rewritten in bf16 (half the bytes, loads fine)."""
    peft_model.save_pretrained(out_dir)
    (out_dir / "README.md").unlink(missing_ok=True)  # PEFT's auto-generated model card template
    weights = out_dir / "adapter_model.safetensors"
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    config_path = out_dir / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = BASE_NAME  # a registry name, not a path on this machine
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--base", default="/work/smollm2-hf", help="HF dir of the base model")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=None, help="default: the task's max_len")
    parser.add_argument("--train", type=int, default=4000, help="train examples to draw")
    parser.add_argument("--eval", type=int, default=100, help="eval examples to draw")
    parser.add_argument("--seed", type=int, default=0)
    # One thread: with the 2 cores shared, 2 OpenMP threads spin at barriers while the other is
    # descheduled (measured: 11 CPU-s per LoRA step with 2 threads vs 2 CPU-s with 1).
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fp32", action="store_true", help="no bf16 autocast (slower on CPUs with AMX)")
    parser.add_argument("--out", type=Path, default=None, help="profile dir (default profiles/<task>)")
    args = parser.parse_args(argv)

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    task = TASKS[args.task]
    max_len = args.max_len or task.max_len
    out = args.out or PROFILES / task.name
    train_examples, eval_examples = build_splits(task, args.train, args.eval, args.seed)
    write_jsonl(out / "eval.jsonl", eval_examples)

    tokenizer = AutoTokenizer.from_pretrained(args.base)
    encoded = encode_for_training(tokenizer, train_examples, max_len)
    print(f"{task.name}: {len(encoded)} train examples (of {len(train_examples)} drawn), "
          f"{len(eval_examples)} eval", flush=True)

    torch.manual_seed(args.seed)
    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    lora = LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=TARGETS,
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    params = [p for p in model.parameters() if p.requires_grad]
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch, lr=args.lr, max_len=max_len, seed=args.seed,
                      bf16=not args.fp32)
    result = train(model, params, encoded, cfg, pad_id=tokenizer.pad_token_id,
                   log=lambda line: print(line, flush=True))

    save_adapter_bf16(model, out / "adapter")
    write_recipe(out, task, "lora", {
        "generator": f"profiles.recipes.data:TASKS[{task.name!r}]",
        "seed": args.seed,
        "train_examples": result.n_train,
        "eval_examples": len(eval_examples),
        "steps": args.steps, "batch": args.batch, "max_len": max_len, "lr": args.lr,
        "optimizer": "AdamW, 10 warmup steps, linear decay to 10%, grad clip 1.0",
        "lora": {"r": args.rank, "alpha": args.alpha, "targets": TARGETS, "dropout": 0.0},
        "precision": "fp32 weights, bf16 autocast" if cfg.bf16 else "fp32",
        "seconds_per_step": round(result.seconds_per_step, 3),
        "threads": args.threads,
        "final_train_loss": round(result.final_loss, 4),
        "command": f"python -m profiles.recipes.train_lora {task.name} --steps {args.steps} "
                   f"--batch {args.batch} --lr {args.lr} --rank {args.rank} --alpha {args.alpha} "
                   f"--max-len {max_len} --train {args.train} --eval {args.eval} --seed {args.seed}",
    })
    print(f"saved {out}: {result.seconds_per_step:.2f}s/step, final loss {result.final_loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
