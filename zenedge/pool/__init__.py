"""The pool's orchestration: what enters the pool, what leaves it, and how (layer 3: it reads the
pool, merges, compresses and writes back; the store below it only keeps the invariants).

    pull       `zenedge pull`: the registry resolves and fetches into staging, admission stores
    admission  import_lora / import_bitdelta / check_admission / store_adapter: store if it fits,
               else merge (merger), else evict or refuse
    budget     plan_budget / set_budget / enforce_budget
    merger     PoolMerger: candidates, the fold (LoRA low-rank OPCM, 1-bit dense OPCM), the gate,
               the commit, and the one loop that tries candidates (admission and maintenance)
    shrink     store adapters in smaller formats (bf16, int8, int4) before merging, gated
    gate       the quality gate's scoring (the model reads each member's eval set)
    verdict    the gate's statistics: retention, the sequential test, the accuracy and floor rules
    results    what admission reports (Admitted, Pulled, AttemptSummary, ShrinkStep) and its JSON form
    manual     `zenedge merge`: any merge method, through the merger's gate and commit
    maintain   `zenedge pool maintain` and the daemon's background pass
    export     the pool as PEFT directories / merged models for other engines
    compress   a full fine-tune → a 1-bit delta, admitted
    phases     progress events and the time profile of every pool operation

`pull.pull`, `maintain.maintain` and `export.export` are imported from their modules (a function re-exported
under its module's name would hide the module). Importing this package stays torch-free (pull,
search and budget commands start fast): the merger and the gate, which need torch, are imported
when a merge is tried.
"""

from zenedge.pool.admission import check_admission, import_bitdelta, import_lora, import_path, store_adapter
from zenedge.pool.budget import EvictionPlan, enforce_budget, plan_budget, set_budget
from zenedge.pool.compress import compress_finetune
from zenedge.pool.manual import manual_merge

__all__ = ["EvictionPlan", "check_admission", "compress_finetune", "enforce_budget", "import_bitdelta", "import_lora",
           "import_path", "manual_merge", "plan_budget", "set_budget", "store_adapter"]
