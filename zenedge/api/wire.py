"""The wire contract: every request and response body the daemon speaks.

Two families:
- OpenAI-compatible (`/v1/*`): requests are lenient (unknown fields ignored, because SDKs send
  parameters we do not use); `n` is pinned to 1 so a request for several choices is refused
  rather than silently answered with one.
- Native (`/api/*`): requests are strict (an unknown field is a 422, so a typo never falls back
  to a default).

Errors everywhere: `{"error": {"code", "message", "hint"?}}` (ErrorBody), with `code` taken from
zenedge.errors. Field names follow OpenAI and Ollama where a user would know them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_TOKENS = 65536  # SamplingParams' own limit


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Reply(BaseModel):
    """A response body whose fields are always sent, defaults included (so the schema says required)."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


# -- errors ---------------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable name (zenedge.errors)")
    message: str
    hint: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


# -- OpenAI-compatible requests ---------------------------------------------------------------------
class TextPart(Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(Lenient):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(Lenient):
    include_usage: bool = False


StopStrings = Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=16)]
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]


class SamplingFields(Lenient):
    model: str = Field(min_length=1, max_length=256, description="a profile in the pool or a base name")
    # Up to 100 like the engine (OpenAI stops at 2): `zenedge run` behaves the same with or without a daemon.
    temperature: Annotated[float, Field(ge=0, le=100)] | None = Field(None, description="default 1; 0 = greedy")
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    max_tokens: TokenCount | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None
    stop: Annotated[str, Field(min_length=1, max_length=256)] | StopStrings | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = Field(1, description="only one choice per request")


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = Field(None, description="preferred over max_tokens")


class CompletionRequest(SamplingFields):
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]],
                                                            Field(min_length=1, max_length=1)]


# -- OpenAI-compatible responses --------------------------------------------------------------------
FinishReason = Literal["stop", "length", "cancelled"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(Reply):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason


class ChatCompletion(Reply):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One `data:` event of a streamed chat completion. With stream_options.include_usage, a last
    chunk with no choices carries the usage (as OpenAI does)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None = None


class Completion(BaseModel):
    """A text completion, and (with usage only in the last one) each chunk of a streamed one."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(Reply):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "zenedge"
    kind: str = Field(description="base, lora, bitdelta or merged")
    base: str


class ModelList(Reply):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# -- native API -------------------------------------------------------------------------------------
class Health(Reply):
    status: Literal["ok"] = "ok"
    version: str
    pid: int
    uptime_seconds: float
    home_id: str = Field(description="identifies the pool this daemon serves (a hash, not the path)")


class PoolEntry(BaseModel):
    name: str
    kind: str
    bytes: int
    base: str
    served_by: str
    shared_with: int
    pinned: bool
    version: str
    requests: int
    last_used_at: float


class PoolList(BaseModel):
    models: list[PoolEntry]


class ResidentBase(BaseModel):
    name: str
    load_seconds: float


class CachedVariant(BaseModel):
    key: str
    kind: str
    bytes: int
    names: list[str]
    load_seconds: float
    requests: int
    rate: float
    idle_seconds: float


class SchedulerStats(BaseModel):
    queued: int
    running: int
    max_queue: int
    max_batch: int
    batches: int
    largest_batch: int
    completed: int
    cancelled: int
    failed: int
    rejected: int


class Ps(BaseModel):
    device: str
    dtype: str
    bases: list[ResidentBase]
    cache_budget_bytes: int
    cache_used_bytes: int
    variants: list[CachedVariant]
    inflight: dict[str, int]
    scheduler: SchedulerStats
    rss_bytes: int
    uptime_seconds: float


class RmRequest(Strict):
    name: str


class RmResult(BaseModel):
    name: str
    adapter_id: str
    freed_bytes: int


class BudgetStatus(BaseModel):
    budget_bytes: int
    used_bytes: int
    free_bytes: int
    by_kind: dict[str, int]
    adapters: int
    bases_bytes: int
    config: str


class BudgetRequest(Strict):
    size: str = Field(description='e.g. "8GiB", "16GB", "500MB", "123B"')
    dry_run: bool = False


class EvictedAdapter(BaseModel):
    names: list[str]
    kind: str
    freed_bytes: int


class BudgetPlan(BaseModel):
    budget_bytes: int
    used_before: int
    used_after: int
    evict: list[str] = Field(description="profile names evicted (or, with dry_run, that would be)")
    evicted: list[EvictedAdapter]
    dry_run: bool


class PullRequest(Strict):
    name: str = Field(description="NAME or NAME:VERSION")
    stream: bool = Field(True, description="stream progress as NDJSON; false: one JSON result")


class PullProgress(BaseModel):
    """One NDJSON line of /api/pull: progress, then a last line with status "success" (and the
    result's fields) or an `error` object."""

    model_config = ConfigDict(extra="allow")
    status: str
    file: str | None = None
    completed: int | None = None
    total: int | None = None


class PullResult(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    kind: str
    bytes: int
    adapter_id: str


class PoolEvent(Reply):
    at: float
    kind: str
    name: str | None = None
    detail: Any = None


class MaintenanceInfo(Reply):
    available: bool
    interval_seconds: float
    running: bool
    last_run_at: float | None = None
    last_result: dict[str, Any] | None = None
    last_error: str | None = None
    config_reloads: int


class PoolStatus(BaseModel):
    budget_bytes: int
    used_bytes: int
    free_bytes: int
    by_kind: dict[str, int]
    adapters: int
    max_adapters: int
    names: int
    merges: int
    events: list[PoolEvent]
    maintenance: MaintenanceInfo


class MaintainResult(BaseModel):
    """What `zenedge.maintenance.maintain` reported (its fields belong to it)."""

    model_config = ConfigDict(extra="allow")


# Schemas that travel inside streams (SSE / NDJSON) rather than as whole bodies: the OpenAPI export
# adds them to components so the generated client types include them.
STREAMED = (ChatCompletionChunk, PullProgress, ErrorBody)
