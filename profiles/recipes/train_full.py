"""Full fine-tune of the base on one task; the result becomes a BitDelta profile.

    python -m profiles.recipes.train_full math-full --steps 300 --lr 5e-5

Trains every attention and MLP projection (q/k/v/o, gate/up/down: the 2-D matrices BitDelta
compresses to signs + per-row scales). Embeddings (tied with the lm_head) and norms stay frozen,
so the whole fine-tune lives in the weights the 1-bit delta can carry: BitDelta keeps embeddings
out of the compression, and a changed embedding would be lost or cost 28M fp16 numbers.

Writes the fine-tuned model as an HF dir (config, model.safetensors fp32, tokenizer, and a
copy of recipe.json) to /work/finetunes/<task>/ (large, never committed) and, in the registry,
profiles/<task>/eval.jsonl + recipe.json. Another step compresses it into the BitDelta profile.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from profiles.recipes.card import write_recipe
from profiles.recipes.data import TASKS, build_splits, write_jsonl
from profiles.recipes.training import TrainConfig, encode_for_training, train

PROFILES = Path(__file__).resolve().parent.parent
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Unfreeze the 2-D projection weights only; everything else stays at the base."""
    params = []
    for name, param in model.named_parameters():
        trainable = param.ndim == 2 and name.split(".")[-2] in PROJECTIONS
        param.requires_grad_(trainable)
        if trainable:
            params.append(param)
    return params


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--base", default="/work/smollm2-hf", help="HF dir of the base model")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-len", type=int, default=None, help="default: the task's max_len")
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--eval", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    # One thread: with the 2 cores shared, 2 OpenMP threads spin at barriers while the other is
    # descheduled (measured: 11 CPU-s per LoRA step with 2 threads vs 2 CPU-s with 1).
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fp32", action="store_true", help="no bf16 autocast (slower on CPUs with AMX)")
    parser.add_argument("--finetunes", type=Path, default=Path("/work/finetunes"))
    parser.add_argument("--out", type=Path, default=None, help="profile dir (default profiles/<task>)")
    args = parser.parse_args(argv)

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
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    params = projection_params(model)
    print(f"training {sum(p.numel() for p in params) / 1e6:.1f}M of "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters", flush=True)
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch, lr=args.lr, max_len=max_len,
                      seed=args.seed, bf16=not args.fp32)
    result = train(model, params, encoded, cfg, pad_id=tokenizer.pad_token_id,
                   log=lambda line: print(line, flush=True))

    finetune_dir = args.finetunes / task.name
    model.save_pretrained(finetune_dir, safe_serialization=True)
    tokenizer.save_pretrained(finetune_dir)
    card = write_recipe(out, task, "bitdelta", {
        "generator": f"profiles.recipes.data:TASKS[{task.name!r}]",
        "seed": args.seed,
        "train_examples": result.n_train,
        "eval_examples": len(eval_examples),
        "steps": args.steps, "batch": args.batch, "max_len": max_len, "lr": args.lr,
        "optimizer": "AdamW, 10 warmup steps, linear decay to 10%, grad clip 1.0",
        "trained": "q/k/v/o/gate/up/down projections (embeddings and norms frozen)",
        "full_finetune_dir": str(finetune_dir),
        "precision": "fp32 weights, bf16 autocast" if cfg.bf16 else "fp32",
        "seconds_per_step": round(result.seconds_per_step, 3),
        "threads": args.threads,
        "final_train_loss": round(result.final_loss, 4),
        "command": f"python -m profiles.recipes.train_full {task.name} --steps {args.steps} "
                   f"--batch {args.batch} --lr {args.lr} --max-len {max_len} --train {args.train} "
                   f"--eval {args.eval} --seed {args.seed}",
    })
    shutil.copy(card, finetune_dir / "recipe.json")
    print(f"saved {finetune_dir}: {result.seconds_per_step:.2f}s/step, final loss {result.final_loss:.4f}",
          flush=True)


if __name__ == "__main__":
    main()
