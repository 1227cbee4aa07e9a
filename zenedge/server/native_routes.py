"""Native endpoints: /health and /api/{pull,import,list,ps,rm,budget,pool,stop,pin,merge,compress}.

Pool changes go through the same functions the CLI uses (Store, zenedge.pool, zenedge.pool.pull),
in a thread, and are followed by `sync_cache` so a removed or merged-away variant leaves memory too.

/api/pull and /api/ps are also Ollama's paths, and serve both shapes in one body: every pull
progress line is also an Ollama progress line (`status`, integer `completed`/`total`, `digest`),
and /api/ps adds Ollama's `models` list to zenedge's fields. A pull that names `model` (Ollama's
field) rather than `name` gets its errors in Ollama's shape too.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Callable

import psutil
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from zenedge.api import wire
from zenedge.errors import InvalidInput, ZenedgeError
from zenedge.names import split_reference
from zenedge.pool import listing
from zenedge.pool.budget import set_budget as set_pool_budget
from zenedge.server import errors, ollama_models, ollama_routes, streaming
from zenedge.server.background import Background
from zenedge.server.errors import Forbidden
from zenedge.server.security import over_unix_socket
from zenedge.server.state import DaemonState

NDJSON_DOC = {200: {"description": "with `stream: true` (the default), NDJSON lines of PullProgress",
                    "content": {"application/x-ndjson": {"schema": {"$ref": "#/components/schemas/PullProgress"}}}}}


def router(state: DaemonState, background: Background) -> APIRouter:
    api = APIRouter(tags=["native"])

    @api.get("/health", response_model=wire.Health)
    async def health() -> dict:
        return state.health()  # no I/O: a liveness probe must stay cheap

    @api.post("/api/stop", response_model=wire.Stopping)
    async def stop(body: wire.NoFields | None = None) -> dict:
        # After this reply is on its way: the shutdown stops accepting, then lets it (and every
        # other request in flight) finish within the grace period.
        asyncio.get_running_loop().call_soon(state.stop)
        return {"status": "stopping", "pid": os.getpid(), "grace_seconds": state.settings.grace_seconds}

    @api.get("/api/list", response_model=wire.PoolList)
    async def list_() -> dict:
        return {"models": await run_in_threadpool(listing.entries, state.store, state.cfg)}

    @api.get("/api/ps", response_model=wire.Ps)
    async def ps() -> dict:
        running = await run_in_threadpool(ollama_models.running, state.store, state.engine)
        return {"models": running, **await run_in_threadpool(state.engine.ps), "scheduler": state.scheduler.stats(),
                "rss_bytes": psutil.Process().memory_info().rss, "uptime_seconds": state.uptime}

    @api.post("/api/rm", response_model=wire.RmResult)
    async def rm(body: wire.RmRequest) -> dict:
        def remove(progress) -> dict:
            result = state.store.remove_name(body.name)
            state.sync_cache()
            return result

        return await state.jobs.run(f"rm {body.name}", remove)

    @api.get("/api/budget", response_model=wire.BudgetStatus)
    async def budget() -> dict:
        return await run_in_threadpool(_budget_status, state)

    @api.put("/api/budget", response_model=wire.BudgetPlan)
    async def set_budget(body: wire.BudgetRequest) -> dict:
        def change(progress=None):
            return set_pool_budget(state.store, state.cfg, body.size, dry_run=body.dry_run, engine=state.engine)

        plan = await (run_in_threadpool(change) if body.dry_run else state.jobs.run(f"budget set {body.size}", change))
        if not body.dry_run:
            await background.reload()  # the new budget is in the file now: put it in force here too
            await run_in_threadpool(state.sync_cache)
        return plan.as_dict(body.dry_run)

    @api.get("/api/pool", response_model=wire.PoolStatus)
    async def pool() -> dict:
        status = await run_in_threadpool(_pool_status, state)
        return {**status, "maintenance": background.info(), "jobs": state.jobs.info()}

    @api.post("/api/pool", response_model=wire.MaintainResult)
    async def maintain(body: wire.NoFields | None = None) -> dict:
        return await background.maintain()

    @api.post("/api/pull", response_model=wire.PullResult, responses=NDJSON_DOC)
    async def pull(body: wire.PullRequest):
        ollama = body.model is not None
        name = ollama_routes.model_name(body.model) if ollama else body.name
        try:
            # A bad name is a 400 at once, not a line in a stream that first waited behind other pulls.
            split_reference(name)
            from zenedge.pool.pull import pull as pull_fn

            def job(progress) -> dict:
                return pull_fn(state.store, state.cfg, name, progress=progress, engine=state.engine).as_dict()

            if not body.stream:
                result = await state.jobs.run(f"pull {name}", job)
                await run_in_threadpool(state.sync_cache)
                return {**result, "status": "success"}
            error_line = ollama_routes.error_line if ollama else errors.stream_payload
            return await _streamed_job(state, f"pull {name}", job, error_line)
        except ZenedgeError as exc:
            if ollama:
                return ollama_routes.error_response(exc)
            raise

    @api.post("/api/import", response_model=wire.PullResult, responses=NDJSON_DOC)
    async def import_(body: wire.ImportRequest, request: Request):
        if not over_unix_socket(request.scope):  # it reads files: only for this machine's user
            raise Forbidden("/api/import reads files on the daemon's machine: use the Unix socket")
        path, eval_path = _absolute(body.path), _absolute(body.eval) if body.eval else None
        from zenedge.pool import import_path

        def job(progress=None) -> dict:
            return import_path(state.store, state.cfg, path, body.name, base=body.base, eval_path=eval_path,
                               engine=state.engine, progress=progress).as_dict()

        if not body.stream:
            result = await state.jobs.run(f"import {body.name}", job)
            await run_in_threadpool(state.sync_cache)
            return {**result, "status": "success"}
        return await _streamed_job(state, f"import {body.name}", job, errors.stream_payload)

    @api.post("/api/pin", response_model=wire.PinResult)
    async def pin(body: wire.PinRequest) -> dict:
        def change(progress) -> dict:
            row = state.store.set_pinned(body.name, body.pinned)
            return {"name": body.name, "adapter_id": row["id"], "pinned": bool(row["pinned"])}

        return await state.jobs.run(f"{'pin' if body.pinned else 'unpin'} {body.name}", change)

    @api.post("/api/merge", response_model=wire.MergeResult, responses=NDJSON_DOC)
    async def merge(body: wire.MergeRequest):
        from zenedge.pool import manual_merge

        def job(progress=None) -> dict:
            return manual_merge(state.store, state.cfg, body.names, body.method, force=body.force,
                                engine=state.engine, progress=progress)

        label = f"merge {', '.join(body.names)}"
        if not body.stream:
            result = await state.jobs.run(label, job)
            await run_in_threadpool(state.sync_cache)
            return {**result, "status": "success"}
        return await _streamed_job(state, label, job, errors.stream_payload)

    @api.post("/api/compress", response_model=wire.PullResult, responses=NDJSON_DOC)
    async def compress(body: wire.CompressRequest, request: Request):
        if not over_unix_socket(request.scope):  # it reads files: only for this machine's user
            raise Forbidden("/api/compress reads files on the daemon's machine: use the Unix socket")
        paths = {key: _absolute(value) for key, value in
                 (("finetuned", body.finetuned), ("eval", body.eval), ("output", body.output)) if value}
        from zenedge.pool import compress_finetune

        def job(progress=None) -> dict:
            def say(line: str) -> None:
                if progress is not None:
                    progress({"status": line, "phase": "compress"})
            return compress_finetune(state.store, state.cfg, paths["finetuned"], body.name, base=body.base,
                                     distill=body.distill, steps=body.steps, eval_path=paths.get("eval"),
                                     output=paths.get("output"), progress=say, base_progress=say)

        if not body.stream:
            result = await state.jobs.run(f"compress {body.name}", job)
            return {**result, "status": "success"}
        return await _streamed_job(state, f"compress {body.name}", job, errors.stream_payload)

    return api


def _absolute(value: str) -> Path:
    path = Path(value)
    if not path.is_absolute():
        raise InvalidInput(f"{path}: give an absolute path (the daemon's working directory is not yours)")
    return path


def progress_line(update: dict[str, Any]) -> dict[str, Any]:
    """A pull's progress dict, passed through whole, made a valid Ollama progress line as well:
    `status` a string, `completed`/`total` integers (dropped when not numbers), `digest` from a
    `sha256` the update names."""
    line = dict(update)
    line["status"] = str(line.get("status") or line.get("phase") or "working")
    for key in ("completed", "total"):
        value = line.get(key)
        if value is None or isinstance(value, int) and not isinstance(value, bool):
            continue
        if isinstance(value, float):
            line[key] = int(value)
        else:
            del line[key]
    if "digest" not in line and isinstance(line.get("sha256"), str):
        line["digest"] = f"sha256:{line['sha256']}"
    return line


async def _streamed_job(state: DaemonState, label: str, job: Callable[[Callable[[dict], None]], dict], error_line):
    """Run a pull or an import (`job(progress)`) as a pool job (pool_jobs.py: one at a time, in
    order; a waiting one says what it waits for); its progress callbacks become NDJSON lines. An
    error before the first progress line is an ordinary HTTP error; after it, a last
    `error_line(exc)` line."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def progress(update: dict[str, Any]) -> None:
        if update.get("status") != "success":  # the last line says success, with the whole result
            loop.call_soon_threadsafe(events.put_nowait, ("progress", progress_line(update)))

    def run(job_progress) -> None:
        # On the daemon's engine: a merge's quality gate reuses the resident base instead of
        # loading another copy (the runtime keeps each thread's batch apart).
        result = job(job_progress)
        state.sync_cache()
        return result

    def finished(future) -> None:
        error = future.exception()
        loop.call_soon_threadsafe(events.put_nowait, ("error", error) if error else ("done", dict(future.result())))

    # It keeps going if the client leaves: it commits whole or not at all.
    state.jobs.submit(label, run, progress).add_done_callback(finished)
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
                yield streaming.ndjson(progress_line({**data, "status": "success"}))
                return
            else:
                yield streaming.ndjson(error_line(data))
                return
            current = await events.get()

    return streaming.JobStreamingResponse(lines(), on_close=lambda: None, media_type="application/x-ndjson")


def _budget_status(state: DaemonState) -> dict:
    usage = state.store.usage()
    return {"budget_bytes": state.cfg.budget, "used_bytes": usage.used_bytes,
            "free_bytes": max(0, state.cfg.budget - usage.used_bytes), "by_kind": usage.by_kind,
            "adapters": usage.adapters, "bases_bytes": usage.bases_bytes, "config": str(state.cfg.path)}


def _pool_status(state: DaemonState) -> dict:
    status = _budget_status(state)
    del status["bases_bytes"], status["config"]
    return {**status, "max_adapters": state.cfg.pool.max_adapters, "names": len(state.store.names()),
            "merges": len(state.store.merges()),
            "events": [{k: e[k] for k in ("at", "kind", "name", "detail")} for e in state.store.events(10)]}
