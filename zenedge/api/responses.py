"""The wire of OpenAI's Responses API (`POST /v1/responses`, the SDK's `client.responses`): its
request, its response object and its stream events.

Nothing is kept between requests (`store` is refused, so is `previous_response_id`): a
conversation is sent whole as `input`, a string or a list of items: messages, earlier
`function_call`s and their `function_call_output`s. `Input.chat_messages` turns those items into
the chat-template messages the chat route renders, so both APIs reach the engine the same way.
Fields zenedge does not honour follow the rules of fields.OPENAI_RESPONSES.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator

from zenedge.api import fields
from zenedge.api.wire import MAX_TOP_LOGPROBS, Honoured, Reply, TokenCount, TokenLogprobs, Tool, ToolFunction
from zenedge.errors import InvalidInput

CallId = Annotated[str, Field(max_length=128)]


# -- the request ----------------------------------------------------------------------------------
class InputText(Honoured):
    where = "input[].content[]."
    type: Literal["input_text", "output_text"] = Field(description='"output_text": an earlier answer\'s text')
    text: str
    annotations: list[Any] | None = None   # sent back with an earlier answer's text; always empty here
    logprobs: list[Any] | None = None


class MessageItem(Honoured):
    where = "input[]."
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"] = Field(
        description='"developer" renders as "system", as on /v1/chat/completions')
    content: str | list[InputText]
    id: str | None = None        # an earlier output item's id, sent back with it
    status: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class FunctionCallItem(Honoured):
    """An earlier answer's call, sent back before its output."""

    where = "input[]."
    type: Literal["function_call"]
    call_id: CallId
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=1 << 20, description="a JSON object, as text")
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Honoured):
    where = "input[]."
    type: Literal["function_call_output"]
    call_id: CallId
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)


def _item_type(item: Any) -> str:
    # A message may leave out its `type` (the SDK's EasyInputMessage).
    return (item.get("type") if isinstance(item, dict) else getattr(item, "type", None)) or "message"


# Chosen by `type` before validating: each item model refuses the other items' fields.
InputItem = Annotated[Union[Annotated[MessageItem, Tag("message")], Annotated[FunctionCallItem, Tag("function_call")],
                            Annotated[FunctionCallOutputItem, Tag("function_call_output")]],
                      Discriminator(_item_type)]


def chat_messages(instructions: str | None, items: str | list[InputItem]) -> list[dict]:
    """The conversation as chat-template messages: `instructions` first as the system message, an
    answer's calls joined to its assistant turn, each call's output as a tool turn."""
    messages = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "tool", "content": item.text(), "tool_call_id": item.call_id})
    return messages


class FunctionTool(Honoured):
    """A tool of the Responses API: the function's fields at the top level (chat nests them)."""

    where = "tools[]."
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = Field(None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def as_chat_tool(self) -> Tool:
        return Tool(type="function", function=ToolFunction(name=self.name, description=self.description,
                                                           parameters=self.parameters, strict=self.strict))


class NamedFunctionChoice(Honoured):
    where = "tool_choice."
    type: Literal["function"]
    name: str


class TextFormat(Honoured):
    where = "text.format."
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "TextFormat":
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError('text.format type "json_schema" needs `schema`')
        return self


class TextConfig(Honoured):
    unhonoured = fields.OPENAI_RESPONSES_TEXT
    where = "text."
    format: TextFormat | None = None


class ResponseRequest(Honoured):
    unhonoured = fields.OPENAI_RESPONSES
    model: str = Field(min_length=1, max_length=256, description="a profile in the pool or a base name")
    input: str | list[InputItem] = Field(description="a user message, or the conversation's items")
    instructions: str | None = Field(None, description="the system message")
    max_output_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(ge=0, le=100)] | None = Field(None, description="default 1; 0 = greedy")
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    tools: list[FunctionTool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    text: TextConfig | None = None
    stream: bool | None = False
    include: list[Literal["message.output_text.logprobs"]] | None = Field(
        None, description="extra output: only the answer's token log-probabilities (reasoning, search results and "
                          "the other includables have nothing to show here)")
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description="with include message.output_text.logprobs: the likeliest tokens at each position")

    def logprobs(self) -> int | None:
        """SamplingParams.logprobs: None (off), or how many alternatives to list."""
        if "message.output_text.logprobs" not in (self.include or []):
            if self.top_logprobs:
                raise InvalidInput('`top_logprobs` needs `include: ["message.output_text.logprobs"]`')
            return None
        return self.top_logprobs or 0

    @model_validator(mode="after")
    def _something_to_answer(self) -> "ResponseRequest":
        if isinstance(self.input, list) and not self.input:
            raise ValueError("`input` needs at least one item")
        return self


# -- the response -----------------------------------------------------------------------------------
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[TokenLogprobs] | None = Field(None, description='with include "message.output_text.logprobs"')


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = Union[OutputMessage, OutputFunctionCall]


class ResponseUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int] = {"cached_tokens": 0}
    output_tokens_details: dict[str, int] = {"reasoning_tokens": 0}


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str = "server_error"
    message: str


class Response(Reply):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]
    model: str
    output: list[OutputItem]
    instructions: str | None = None
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = Field(None, description='with "failed": why (the grammar admitted no next token)')
    usage: ResponseUsage | None = None
    tools: list[FunctionTool] = []
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    text: dict[str, Any] = {"format": {"type": "text"}}
    store: bool = False

    @property
    def output_text(self) -> str:
        return "".join(part.text for item in self.output if isinstance(item, OutputMessage) for part in item.content)
