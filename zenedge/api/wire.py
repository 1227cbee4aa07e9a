"""The wire contract: every request and response body the daemon speaks.

Three families:
- OpenAI-compatible (`/v1/*`) and Ollama-compatible (`/api/tags`, `/api/chat`, … : the `Ollama*`
  types): nothing is ignored silently. A field the model declares is honoured; any other field
  the official clients send is accepted only where it cannot change the answer, or at the value
  that asks for nothing (`tools: []`, `top_k: 0`), and refused with a 400 naming it otherwise
  (the rules, field by field: fields.py). Declared fields whose meaning
  zenedge cannot honour (images, tools) are refused by the routes.
  `/api/pull` and `/api/ps` serve both the native and Ollama's shape in one body.
- Native (`/api/*`): requests are strict (an unknown field is a 422, so a typo never falls back
  to a default).

Errors: `{"error": {"code", "message", "hint"?}}` (ErrorBody), with `code` taken from
zenedge.errors; the Ollama-only routes answer Ollama's `{"error": "message"}` (OllamaError), as
does /api/pull when the request names `model` (Ollama's field) instead of `name`. Field names
follow OpenAI and Ollama where a user would know them.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from zenedge.api import fields
from zenedge.errors import InvalidInput

MAX_TOKENS = 65536  # SamplingParams' own limit
MAX_CHOICES = 8  # `n`: a batch's rows (the daemon's max_batch)
MAX_TOP_LOGPROBS = 20  # SamplingParams' own limit
MAX_EMBEDDING_INPUTS = 256  # texts per embedding request (each also bounded in tokens: runtime/embed.py)


def _no_lone_surrogates(value: Any) -> Any:
    """Python's JSON decoder turns an escaped lone surrogate ("\\ud800") into a str that no UTF-8
    encoder or tokenizer accepts: refuse it here (422) rather than fail in the middle of a request."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("text holds a lone UTF-16 surrogate (an escape like \\ud800), not a character") from None
    elif isinstance(value, dict):
        for item in value.values():
            _no_lone_surrogates(item)
    elif isinstance(value, list):
        for item in value:
            _no_lone_surrogates(item)
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _encodable_text(cls, data: Any) -> Any:
        return _no_lone_surrogates(data)


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _encodable_text(cls, data: Any) -> Any:
        return _no_lone_surrogates(data)


class Honoured(Lenient):
    """A request of the OpenAI or Ollama dialect: a field it does not declare gets through only if
    `unhonoured` (a table of fields.py) accepts its value; it is then dropped. `where` prefixes the
    field's name in the error (a nested object's path)."""

    unhonoured: ClassVar[dict[str, fields.Rule]] = {}
    where: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _nothing_ignored(cls, data: Any) -> Any:
        declared = {field.alias or name for name, field in cls.model_fields.items()}
        fields.check(data, declared, cls.unhonoured, cls.where)
        return data


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
class TextPart(Honoured):
    where = "messages[].content[]."
    type: Literal["text"]
    text: str


class FunctionCall(Honoured):
    where = "messages[].tool_calls[].function."
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=1 << 20, description="a JSON object, as text")


class ToolCall(Honoured):
    """An earlier call in the history (an assistant turn), or one in a reply."""

    where = "messages[].tool_calls[]."
    id: str = Field(max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Honoured):
    unhonoured = fields.OPENAI_MESSAGE
    where = "messages[]."
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(
        description='"developer" is OpenAI\'s newer name for "system" and renders as one; "tool": a call\'s result')
    content: str | list[TextPart] | None = Field(None, description="null only for an assistant turn (read as empty)")
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant turn's calls")
    tool_call_id: str | None = Field(None, max_length=128, description="a tool turn: the call it answers")

    def for_template(self) -> dict:
        message = {"role": self.template_role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        return message

    @model_validator(mode="after")
    def _content_given(self) -> "ChatMessage":
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs `content`")
        return self

    @property
    def template_role(self) -> str:
        return "system" if self.role == "developer" else self.role

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(Honoured):
    unhonoured = fields.OPENAI_STREAM_OPTIONS
    where = "stream_options."
    include_usage: bool = False


StopStrings = Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=16)]
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Penalty = Annotated[float, Field(ge=-2, le=2)]


class SamplingFields(Honoured):
    model: str = Field(min_length=1, max_length=256, description="a profile in the pool or a base name")
    # Up to 100 like the engine (OpenAI stops at 2): `zenedge run` behaves the same with or without a daemon.
    temperature: Annotated[float, Field(ge=0, le=100)] | None = Field(None, description="default 1; 0 = greedy")
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    presence_penalty: Penalty | None = Field(None, description="subtracted from a token's logit once it is in the answer")
    frequency_penalty: Penalty | None = Field(None, description="subtracted once per time a token is in the answer")
    max_tokens: TokenCount | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None
    stop: Annotated[str, Field(min_length=1, max_length=256)] | StopStrings | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = Field(
        1, description=f"choices (1-{MAX_CHOICES}), decoded as rows of one batch; with a seed, choice i samples with "
                       "seed + i")


class JsonSchemaFormat(Honoured):
    where = "response_format.json_schema."
    name: str = Field("response", min_length=1, max_length=64, description="names the schema")
    description: str | None = Field(None, description="what the output is for (not rendered into the prompt)")
    # (`schema` itself would shadow pydantic's BaseModel.schema())
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema", description="absent: any JSON value")
    strict: bool | None = Field(None, description="the output always validates against the schema, strict or not")


class ResponseFormat(Honoured):
    where = "response_format."
    type: Literal["text", "json_object", "json_schema"] = Field(
        description='"json_object": any JSON object; "json_schema": JSON valid against json_schema.schema '
                    "(decoded under a grammar: the output always parses and validates)")
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('response_format type "json_schema" needs `json_schema`')
        return self


class ToolFunction(Honoured):
    where = "tools[].function."
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = Field(None, max_length=8192)
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments; absent: no arguments")
    strict: bool | None = Field(None, description="a required call always validates against `parameters`")


class Tool(Honoured):
    where = "tools[]."
    type: Literal["function"]
    function: ToolFunction


class NamedFunction(Honoured):
    where = "tool_choice.function."
    name: str


class NamedToolChoice(Honoured):
    where = "tool_choice."
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    unhonoured = fields.OPENAI_CHAT
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = Field(None, description="each answer token's log-probability under the model (its "
                                                    "logits before penalties, temperature and any grammar)")
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description="with logprobs: the likeliest tokens at each position, and theirs")
    max_completion_tokens: TokenCount | None = Field(None, description="preferred over max_tokens")
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description='"auto" (the default with tools): a call is returned when the answer is one that parses '
                          'and validates; "required" or a named function: the answer is one call, decoded under '
                          "its schema's grammar; \"none\": no call")


class CompletionRequest(SamplingFields):
    unhonoured = fields.OPENAI_COMPLETION
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = Field(
        None, description="each token's log-probability and the likeliest this many at its position (0-5); "
                          "false or absent: none")

    @field_validator("logprobs", mode="before")
    @classmethod
    def _false_is_none(cls, value: Any) -> Any:
        return None if value is False else value   # SDKs send false for "none" (and 0 asks for some)
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]],
                                                            Field(min_length=1, max_length=1)]


# -- OpenAI-compatible responses --------------------------------------------------------------------
FinishReason = Literal["stop", "length", "cancelled", "error", "tool_calls"]
RowError = Field(None, description='with finish_reason "error": one line on why the answer ended there '
                                   "(its grammar admitted no next token)")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(Reply):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(BaseModel):
    token: str = Field(description="the token's text (bytes that are not whole UTF-8 as U+FFFD)")
    logprob: float
    bytes: list[int] = Field(description="the token's UTF-8 bytes")


class TokenLogprobs(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(description="the likeliest tokens at this position, likeliest first")


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobs] | None
    refusal: list[TokenLogprobs] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None
    error: str | None = RowError


class ChatCompletion(Reply):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChunkToolCall(ToolCall):
    index: int


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None
    error: str | None = RowError


class ChatCompletionChunk(BaseModel):
    """One `data:` event of a streamed chat completion. With stream_options.include_usage, a last
    chunk with no choices carries the usage (as OpenAI does)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions' shape: one entry per token in each list."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int] = Field(description="where each token starts in the choice's text (characters)")


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None = None
    logprobs: CompletionLogprobs | None = None
    error: str | None = RowError


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


EmbeddingText = Annotated[str, Field(max_length=1 << 20)]
EmbeddingInputs = Annotated[list[EmbeddingText], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]


class EmbeddingRequest(Honoured):
    unhonoured = fields.OPENAI_EMBEDDING
    model: str = Field(min_length=1, max_length=256, description="a profile in the pool or a base name")
    input: EmbeddingText | EmbeddingInputs = Field(description="text, or a list of texts (token ids are refused: "
                                                               "they belong to another tokenizer)")
    encoding_format: Literal["float", "base64"] | None = Field(
        "float", description="base64: each vector as little-endian float32 bytes (what OpenAI's SDKs ask for); "
                             "null: float")
    dimensions: Annotated[int, Field(ge=1)] | None = Field(
        None, description="keep the first N dimensions, re-normalised (at most the model's width)")

    @model_validator(mode="before")
    @classmethod
    def _text_not_token_ids(cls, data: Any) -> Any:
        if isinstance(data, dict) and _token_ids(data.get("input")):
            raise InvalidInput(
                "`input` holds token ids; zenedge embeds text only: ids come from the client's tokenizer "
                "(tiktoken's, for langchain-openai), not the model's",
                hint="send the texts (langchain-openai: OpenAIEmbeddings(check_embedding_ctx_length=False))")
        return data


def _token_ids(value: Any) -> bool:
    """OpenAI's `input` as token ids: a list of ints, or a list of such lists."""
    if not isinstance(value, list) or not value:
        return False
    first = value[0][0] if isinstance(value[0], list) and value[0] else value[0]
    return isinstance(first, int) and not isinstance(first, bool)


class Embedding(Reply):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="unit-length vector; a base64 string with encoding_format base64")


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Reply):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# -- native API -------------------------------------------------------------------------------------
class Health(Reply):
    status: Literal["ok"] = "ok"
    version: str
    pid: int
    uptime_seconds: float
    home_id: str = Field(description="identifies the pool this daemon serves (a hash, not the path)")
    on_demand: bool = Field(False, description="started by a command (it exits when idle); `zenedge serve` takes over "
                                               "from such a daemon")


class Stopping(Reply):
    status: Literal["stopping"] = "stopping"
    pid: int
    grace_seconds: float = Field(description="how long requests in flight get to finish")


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
    compressed_to: str | None = Field(None, description="int8 or int4 where the pool re-stored it smaller to make room")


class PoolList(BaseModel):
    models: list[PoolEntry]


class DecodePath(BaseModel):
    """How a resident base's requests decode, decided by the functions the decode loop calls."""

    stepper: str = Field(description='"static", "dynamic", or "graphed" (CUDA: requests of 8 new tokens or more; '
                                     'shorter ones run static)')
    forward: str = Field(description='"lean" (zenedge\'s Llama-family forward) or "transformers"')
    weights: str = Field(description='the CPU matmul weight format: "full", "int8" or "int4" ("full" on CUDA)')
    native_kernels: bool = Field(description="zenedge's C kernels for the CPU are loaded")
    native_kernels_off: str | None = Field(None, description="why they are not")
    native_isa: str | None = Field(None, description='the instruction set they are built for: "avx512vnni", '
                                                     '"avx512", "avx2", "neon" or "scalar"')
    native_isa_why: str | None = Field(None, description="why that one (the CPU's features, or ZENEDGE_CPU_ISA)")
    lean_refused: str | None = Field(None, description="why the forward is not the lean one")
    c_step_fallback: str | None = Field(None, description="why the latest decode batch ran the Python step, not "
                                                          "the one-call C step (never an error: the same numbers)")


class ResidentBase(BaseModel):
    name: str
    load_seconds: float
    decode: DecodePath | None = Field(None, description="the decode path in use (absent from older daemons)")


class Threads(BaseModel):
    """torch's CPU threads in this daemon and why (runtime/threads.py)."""

    setting: str | int = Field(description='"auto" or a fixed count')
    source: str = Field(description="where a fixed count comes from (runtime.threads or ZENEDGE_THREADS)")
    cores: int = Field(description="usable cores")
    cores_limited_by: str = Field(description="what limits them: physical cores, CPU affinity, a cgroup quota, OMP_NUM_THREADS")
    wide: int = Field(description="threads for prompt prefill and torch-kernel decode steps now")
    wide_why: str
    decode: int | None = Field(None, description="threads for a decode step of the resident bases")
    decode_why: str | None = None


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
    """zenedge's view of memory, plus Ollama's `models` list (what GET /api/ps answers Ollama clients)."""

    models: list["OllamaRunningModel"] = Field(description="Ollama's shape: resident bases and cached profiles")
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
    threads: Threads | None = Field(None, description="torch's CPU threads and why (absent from older daemons)")


class NoFields(Strict):
    """The body of a request that takes no fields: none at all, or `{}` (any field is refused: 422)."""


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


class CompressStep(BaseModel):
    """One adapter the pool tried to store in a smaller format to make room (zenedge.pool.shrink)."""

    names: list[str]
    stored_as: str = Field(description="its format before: fp32, fp16, bf16, int8")
    compressed_to: str = Field(description="bf16, int8 or int4")
    retention: dict[str, float] = Field(description="per profile, the share of its gain the smaller form keeps")
    freed_bytes: int
    kept: bool = Field(description="false: a profile kept less than pool.compress_threshold; nothing changed")


class BudgetPlan(BaseModel):
    budget_bytes: int
    used_before: int
    used_after: int
    evict: list[str] = Field(description="profile names evicted (or, with dry_run, that would be)")
    evicted: list[EvictedAdapter]
    compressed: list[CompressStep] = Field([], description="adapters stored smaller first (never in a dry run)")
    dry_run: bool


class PullRequest(Strict):
    """zenedge sends `name`; Ollama's clients send `model` (and `insecure`). One of the two."""

    name: str | None = Field(None, min_length=1, max_length=256, description="NAME or NAME:VERSION")
    model: str | None = Field(None, min_length=1, max_length=256,
                              description="Ollama's field for the name (`NAME:latest` = NAME); errors then "
                                          "come in Ollama's shape")
    stream: bool = Field(True, description="stream progress as NDJSON; false: one JSON result")
    insecure: bool = Field(False, description="accepted for Ollama's clients; the registry URL decides the transport")

    @model_validator(mode="after")
    def _one_name(self) -> "PullRequest":
        if self.name is None and self.model is None:
            raise ValueError("give the profile to pull as `name` (or `model`)")
        if self.name is not None and self.model is not None and self.name != self.model:
            raise ValueError("`name` and `model` disagree: give one of them")
        return self


class ImportRequest(Strict):
    """`zenedge import` through the daemon: files on this machine, read by the daemon (Unix socket only)."""

    path: str = Field(min_length=1, max_length=4096, description="absolute path of a PEFT LoRA directory or a .bitdelta file")
    name: str = Field(min_length=1, max_length=256)
    base: str | None = Field(None, max_length=256, description="base model name (default: the default base)")
    eval: str | None = Field(None, min_length=1, max_length=4096, description="absolute path of an eval set (JSONL)")
    stream: bool = Field(True, description="stream progress as NDJSON (PullProgress lines); false: one JSON result")


class PullProgress(BaseModel):
    """One NDJSON line of /api/pull: progress, then a last line with status "success" (and the
    result's fields) or an `error`. Every line is also one of Ollama's: `status` is always a
    string, `completed`/`total` integers when present, `digest` when the pull names one."""

    model_config = ConfigDict(extra="allow")
    status: str
    file: str | None = None
    digest: str | None = None
    completed: int | None = None
    total: int | None = None


class PullResult(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Literal["success"] = Field("success", description="Ollama's last progress line, for `stream: false`")
    name: str
    kind: str
    bytes: int
    adapter_id: str


class PinRequest(Strict):
    name: str = Field(min_length=1, max_length=256)
    pinned: bool = Field(True, description="false unpins")


class PinResult(BaseModel):
    name: str
    adapter_id: str
    pinned: bool


class MergeRequest(Strict):
    """`zenedge merge` through the daemon: the gate runs on its resident base."""

    names: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(min_length=1, max_length=64)
    method: str = Field("opcm", max_length=64)
    force: bool = Field(False, description="keep the merge even if a member falls below pool.quality_threshold")
    stream: bool = True


class MergeResult(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Literal["success"] = "success"
    adapter_id: str
    members: list[str]
    method: str
    retention: dict[str, float]
    bytes: int


class CompressRequest(Strict):
    """`zenedge compress` through the daemon: files on this machine, read by the daemon (Unix socket only)."""

    finetuned: str = Field(min_length=1, max_length=4096, description="absolute path of the full fine-tune's directory")
    name: str = Field(min_length=1, max_length=256)
    base: str = Field("smollm2-135m", min_length=1, max_length=256)
    distill: bool = False
    steps: int = Field(50, ge=1, le=100_000)
    eval: str | None = Field(None, min_length=1, max_length=4096, description="absolute path of an eval set")
    output: str | None = Field(None, min_length=1, max_length=4096, description="absolute path: keep the .bitdelta file here too")
    stream: bool = True


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


class PoolJobsInfo(Reply):
    running: str | None = Field(description='the pool job running now, e.g. "pull coder"')
    waiting: int = Field(description="jobs queued behind it")
    done: int = Field(description="jobs finished (or failed) since the daemon started")


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
    jobs: PoolJobsInfo | None = Field(None, description="the daemon's pool work queue (absent from older daemons)")


class MaintainResult(BaseModel):
    """What `zenedge.pool.maintain.maintain` reported (its fields belong to it)."""

    model_config = ConfigDict(extra="allow")


# -- Ollama-compatible API ---------------------------------------------------------------------------
KeepAlive = float | Annotated[str, Field(max_length=32)]


class OllamaOptions(Honoured):
    """The `options` zenedge honours. The others: the runner's (num_ctx, num_thread, …) are
    accepted, since zenedge sizes its own; samplers zenedge lacks (top_k, repeat_penalty, …) only
    at their "off" value (fields.OLLAMA_OPTIONS)."""

    unhonoured = fields.OLLAMA_OPTIONS
    where = "options."

    num_predict: Annotated[int, Field(ge=-2, le=MAX_TOKENS)] | None = Field(
        None, description="tokens to generate; absent, 0, -1 or -2: the default cap (256)")
    temperature: Annotated[float, Field(ge=0, le=100)] | None = Field(None, description="default 0.8; 0 = greedy")
    top_p: Annotated[float, Field(gt=0, le=1)] | None = Field(None, description="default 0.9")
    top_k: Annotated[int, Field(ge=0)] | None = Field(None, description="keep the k likeliest tokens; default 0 (off)")
    min_p: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="drop tokens less likely than min_p times the likeliest; default 0 (off)")
    repeat_penalty: Annotated[float, Field(gt=0, le=100)] | None = Field(
        None, description="divides the logit of a token seen in the last repeat_last_n; default 1 (off)")
    repeat_last_n: Annotated[int, Field(ge=-1)] | None = Field(None, description="default 64; -1: the whole context")
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None
    stop: StopStrings | None = None


class OllamaGenerationFields(Honoured):
    model: str = Field(min_length=1, max_length=256, description="a profile or a base (`NAME:latest` = NAME)")
    stream: bool = Field(True, description="NDJSON lines (Ollama's default); false: one JSON object")
    options: OllamaOptions | None = None
    keep_alive: KeepAlive | None = Field(
        None, description='0 drops a profile\'s variant from the delta cache after the request; other values '
                          '("5m", 300, -1) leave it to the cache\'s policy. The base always stays resident.')
    format: Literal["", "json"] | dict[str, Any] | None = Field(
        None, description='"json": any JSON object; a JSON schema: JSON valid against it (decoded under a grammar)')
    think: bool | str | None = Field(None, description="thinking is not supported: true is refused")
    logprobs: bool | None = Field(None, description="each answer token's log-probability under the model (its "
                                                    "logits before penalties, temperature and any grammar)")
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description="with logprobs: the likeliest tokens at each position, and theirs")


class OllamaFunctionCall(Honoured):
    where = "messages[].tool_calls[].function."
    name: str = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = Field(None, description="the call's place among the turn's calls (newer Ollama sends it)")


class OllamaToolCall(Honoured):
    where = "messages[].tool_calls[]."
    function: OllamaFunctionCall


class OllamaMessage(Honoured):
    unhonoured = fields.OLLAMA_MESSAGE
    where = "messages[]."
    role: Literal["system", "user", "assistant", "tool"] = Field(description='"tool": a call\'s result')
    content: str = ""
    images: list[str] | None = Field(None, description="refused when not empty: no vision models")
    tool_calls: list[OllamaToolCall] | None = Field(None, description="an assistant turn's calls")
    tool_name: str | None = Field(None, max_length=64, description="a tool turn: the function that answered")

    def for_template(self) -> dict:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"type": "function", "function": call.function.model_dump(exclude={"index"})}
                                     for call in self.tool_calls]
        if self.tool_name:
            message["name"] = self.tool_name
        return message


class OllamaChatRequest(OllamaGenerationFields):
    unhonoured = fields.OLLAMA_CHAT
    messages: list[OllamaMessage] = Field(default_factory=list, description="empty: load the model and return")
    tools: list[Tool] | None = Field(None, max_length=128, description="rendered into the prompt; a call is returned "
                                     "in `message.tool_calls` when the answer parses as one and validates")


class OllamaGenerateRequest(OllamaGenerationFields):
    unhonoured = fields.OLLAMA_GENERATE
    prompt: str = Field("", description="templated as one user turn (unless raw); empty: load the model and return")
    system: str | None = None
    raw: bool = Field(False, description="send the prompt as it is, without the chat template")
    suffix: str | None = Field(None, description="fill-in-the-middle is not supported: refused when not empty")
    template: str | None = Field(None, description="custom templates are not supported: refused when not empty")
    context: list[int] | None = Field(None, description="continuing from a context is not supported")
    images: list[str] | None = Field(None, description="refused when not empty")


class OllamaStats(BaseModel):
    """Counts, and durations in nanoseconds, on the last line of a generation."""

    total_duration: int | None = None
    load_duration: int | None = Field(None, description="waiting in the queue and loading the base or variant")
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    error: str | None = Field(None, description='with done_reason "error": why the answer ended there')


class OllamaReplyMessage(Reply):
    role: Literal["assistant"] = "assistant"
    content: str
    tool_calls: list[OllamaToolCall] | None = None


class OllamaChatResponse(OllamaStats):
    """/api/chat: one object, or each NDJSON line of a stream (`done` on the last, with the stats)."""

    model: str
    created_at: str
    message: OllamaReplyMessage
    done: bool
    done_reason: str | None = Field(None, description="stop, length, cancelled, error; load or unload for empty requests")
    logprobs: list[TokenLogprobs] | None = Field(None, description="with `logprobs`: the tokens of this line's text")


class OllamaGenerateResponse(OllamaStats):
    """/api/generate: one object, or each NDJSON line of a stream."""

    model: str
    created_at: str
    response: str
    done: bool
    done_reason: str | None = None
    logprobs: list[TokenLogprobs] | None = Field(None, description="with `logprobs`: the tokens of this line's text")


class OllamaModelDetails(Reply):
    parent_model: str = Field(description="for a profile, the base it runs on")
    format: str
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str = Field(description="the stored weights' dtype (e.g. F32, BF16)")


class OllamaModel(Reply):
    """An entry of /api/tags: a base or a profile in the pool."""

    name: str
    model: str
    modified_at: str
    size: int = Field(description="bytes on disk: the adapter's for a profile, the weights' for a base")
    digest: str
    details: OllamaModelDetails
    kind: str = Field(description="zenedge's addition: base, lora, bitdelta or merged")


class OllamaTags(Reply):
    models: list[OllamaModel]


class OllamaNamed(Honoured):
    """A request that names a model: `model`, or the older `name`."""

    model: str | None = Field(None, min_length=1, max_length=256)
    name: str | None = Field(None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _one_name(self) -> "OllamaNamed":
        if not (self.model or self.name):
            raise ValueError("name the model as `model`")
        return self

    @property
    def target(self) -> str:
        return self.model or self.name


class OllamaShowRequest(OllamaNamed):
    verbose: bool = False


class OllamaShowResponse(Reply):
    license: str
    modelfile: str
    parameters: str
    template: str = Field(description="the base's chat template")
    details: OllamaModelDetails
    model_info: dict[str, Any] = Field(description="general.*, <family>.context_length / embedding_length, and "
                                                   "zenedge.* (kind, adapter, base) for a profile")
    capabilities: list[str]
    modified_at: str


class OllamaDeleteRequest(OllamaNamed):
    pass


class OllamaRunningModel(Reply):
    name: str
    model: str
    size: int = Field(description="bytes in memory")
    digest: str
    details: OllamaModelDetails
    expires_at: str | None = Field(None, description="null: held until the cache needs the room (bases: never)")
    size_vram: int
    context_length: int


class OllamaVersion(Reply):
    version: str = Field(description="zenedge's version")


class OllamaEmbedRequest(Honoured):
    model: str = Field(min_length=1, max_length=256)
    input: EmbeddingText | EmbeddingInputs = Field(description='text or texts; "" alone: load the model, no vectors')
    truncate: bool = Field(True, description="cut inputs longer than the limit (false: refuse them)")
    dimensions: Annotated[int, Field(ge=1)] | None = None
    options: dict[str, Any] | None = Field(None, description="runner and sampling settings: an embedding "
                                                            "depends on neither, so all are accepted")
    keep_alive: KeepAlive | None = None


class OllamaEmbedResponse(Reply):
    model: str
    embeddings: list[list[float]] = Field(description="unit-length vectors, one per input")
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class OllamaEmbeddingsRequest(Honoured):
    """The older /api/embeddings (what Hanzo/Shinkai nodes send): one prompt, one vector."""

    model: str = Field(min_length=1, max_length=256)
    prompt: EmbeddingText = ""
    options: dict[str, Any] | None = Field(None, description="runner and sampling settings: an embedding "
                                                            "depends on neither, so all are accepted")
    keep_alive: KeepAlive | None = None


class OllamaEmbeddingsResponse(Reply):
    embedding: list[float] = Field(description="unit-length (Ollama's own is not normalised here); [] for an "
                                               "empty prompt")


class OllamaError(BaseModel):
    """The error body of the Ollama-compatible routes."""

    error: str


Ps.model_rebuild()

# Schemas that travel inside streams (SSE / NDJSON) rather than as whole bodies: the OpenAPI export
# adds them to components so the generated client types include them.
STREAMED = (ChatCompletionChunk, PullProgress, ErrorBody, OllamaChatResponse, OllamaGenerateResponse, OllamaError)
