"""Native endpoints: /health and /api/{pull,list,ps,rm,budget,pool}.

Pool changes go through the same functions the CLI uses (Store, policy, registry.pull, maintain),
in a thread, and are followed by `sync_cache` so a removed or merged-away variant leaves memory too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psutil
from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from zenedge import policy
from zenedge.api import wire
from zenedge.server import errors, streaming
from zenedge.server.maintenance import Maintenance, optional
from zenedge.server.state import DaemonState

NDJSON_DOC = {200: {"description": "with `stream: true` (the default), NDJSON lines of PullProgress",
                    "content": {"application/x-ndjson": {"schema": {"$ref": "#/components/schemas/PullProgress"}}}}}


def router(state: DaemonState, maintenance: Maintenance) -> APIRouter:
    api = APIRouter(tags=["native"])

    @api.get("/health", response_model=wire.Health)
    async def health() -> dict:
        return state.health()  # no I/O: a liveness probe must stay cheap

    @api.get("/api/list", response_model=wire.PoolList)
    async def list_() -> dict:
        return {"models": await run_in_threadpool(_entries, state)}

    @api.get("/api/ps", response_model=wire.Ps)
    async def ps() -> dict:
        return {**state.engine.ps(), "scheduler": state.scheduler.stats(),
                "rss_bytes": psutil.Process().memory_info().rss, "uptime_seconds": state.uptime}

    @api.post("/api/rm", response_model=wire.RmResult)
    async def rm(body: wire.RmRequest) -> dict:
        def remove() -> dict:
            result = state.store.remove_name(body.name)
            state.sync_cache()
            return result

        return await run_in_threadpool(remove)

    @api.get("/api/budget", response_model=wire.BudgetStatus)
    async def budget() -> dict:
        return await run_in_threadpool(_budget_status, state)

    @api.put("/api/budget", response_model=wire.BudgetPlan)
    async def set_budget(body: wire.BudgetRequest) -> dict:
        plan = await run_in_threadpool(policy.set_budget, state.store, state.cfg, body.size, dry_run=body.dry_run)
        if not body.dry_run:
            await maintenance.reload()  # the new budget is in the file now: put it in force here too
            await run_in_threadpool(state.sync_cache)
        return {"budget_bytes": plan.budget, "used_before": plan.used_before, "used_after": plan.used_after,
                "evict": plan.names, "dry_run": body.dry_run,
                "evicted": [{"names": a["names"], "kind": a["kind"], "freed_bytes": a["freed"]} for a in plan.evict]}

    @api.get("/api/pool", response_model=wire.PoolStatus)
    async def pool() -> dict:
        status = await run_in_threadpool(_pool_status, state)
        return {**status, "maintenance": maintenance.info()}

    @api.post("/api/pool", response_model=wire.MaintainResult)
    async def maintain() -> dict:
        return await maintenance.maintain()

    @api.post("/api/pull", response_model=wire.PullResult, responses=NDJSON_DOC)
    async def pull(body: wire.PullRequest):
        pull_fn = optional("zenedge.registry.pull", "pull", "pulling from a registry")
        if not body.stream:
            result = await run_in_threadpool(lambda: pull_fn(state.store, state.cfg, body.name, engine=state.engine))
            await run_in_threadpool(state.sync_cache)
            return result
        return await _streamed_pull(state, pull_fn, body.name)

    return api


async def _streamed_pull(state: DaemonState, pull_fn, name: str):
    """Run the pull in a thread; its progress callbacks become NDJSON lines. An error before the
    first progress line is an ordinary HTTP error; after it, a last `{"error": ...}` line."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def progress(update: dict[str, Any]) -> None:
        if update.get("status") != "success":  # the last line says success, with the whole result
            loop.call_soon_threadsafe(events.put_nowait, ("progress", dict(update)))

    def run() -> None:
        try:
            # The daemon's engine: a merge's quality gate reuses the resident base instead of loading
            # another copy (the runtime keeps each thread's batch apart).
            result = pull_fn(state.store, state.cfg, name, progress=progress, engine=state.engine)
            state.sync_cache()
            loop.call_soon_threadsafe(events.put_nowait, ("done", dict(result)))
        except BaseException as exc:
            loop.call_soon_threadsafe(events.put_nowait, ("error", exc))

    loop.run_in_executor(None, run)  # keeps going if the client leaves: a pull commits whole or not at all
    # Hold back "resolving" lines until the name resolves, so an unknown name is a plain 404.
    held = []
    kind, value = await events.get()
    while kind == "progress" and value.get("status") == "resolving":
        held.append(value)
        kind, value = await events.get()
    if kind == "error":
        raise value

    async def lines():
        for line in held:
            yield streaming.ndjson(line)
        current = (kind, value)
        while True:
            what, data = current
            if what == "progress":
                yield streaming.ndjson(data)
            elif what == "done":
                yield streaming.ndjson({"status": "success", **data})
                return
            else:
                yield streaming.ndjson(errors.stream_payload(data))
                return
            current = await events.get()

    return streaming.JobStreamingResponse(lines(), on_close=lambda: None, media_type="application/x-ndjson")


def _entries(state: DaemonState) -> list[dict]:
    return [{
        "name": row["name"], "kind": row["kind"], "bytes": row["bytes"], "base": row["base"],
        "served_by": row["adapter_id"][:12], "shared_with": row["sharing"] - 1, "pinned": bool(row["pinned"]),
        "version": row["version"] or "", "requests": row["request_count"], "last_used_at": row["last_used_at"],
    } for row in state.store.names()]


def _budget_status(state: DaemonState) -> dict:
    usage = state.store.usage()
    return {"budget_bytes": state.cfg.budget, "used_bytes": usage.used_bytes,
            "free_bytes": max(0, state.cfg.budget - usage.used_bytes), "by_kind": usage.by_kind,
            "adapters": usage.adapters, "bases_bytes": usage.bases_bytes, "config": str(state.cfg.path)}


def _pool_status(state: DaemonState) -> dict:
    status = _budget_status(state)
    del status["bases_bytes"], status["config"]
    return {**status, "max_adapters": state.cfg.get("pool", "max_adapters"), "names": len(state.store.names()),
            "merges": len(state.store.merges()),
            "events": [{k: e[k] for k in ("at", "kind", "name", "detail")} for e in state.store.events(10)]}
