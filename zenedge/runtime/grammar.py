"""Constrained decoding: a row's output held to a grammar (a JSON schema, "any JSON object"), so
that it always parses and validates, whatever the model.

The grammar engine is llguidance (Microsoft's, on PyPI, no dependencies): it compiles a JSON
schema into a grammar and, for each step, gives the set of tokens that keep the output inside it.
It was chosen over xgrammar (faster masks, but torch, transformers, triton and TVM's FFI as
dependencies) for its coverage and for errors that name the keyword; the measurements are in
issue [X]'s notes. A mask costs a few hundred µs on SmolLM2's 49k vocabulary, several ms on the
first token inside a free-form string.

A `Grammar` is checked when a request arrives (an unsupported keyword, a bad pattern or a dangling
$ref is an InvalidInput naming it: a 400, never a failure mid-batch). Each row that carries one
gets its own `GrammarState`; the decode loop masks that row's logits before its sampler chooses,
and rows without a grammar pay nothing. EOS is admitted only where the grammar may end.

An object schema that lists `properties` and says nothing of `additionalProperties` is taken as
closed (`false`), as llama.cpp's schema converter does: the output still validates against the
schema as sent, and a small model does not pad it with invented keys.
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from zenedge.errors import InvalidInput
from zenedge.runtime.prompts import tool_style

# Compact JSON, as `json.dumps` writes it with separators (", ", ": "): no free whitespace, which a
# small model would otherwise fill with newlines until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_MAX_SCHEMA_BYTES = 256 * 1024
_VALUES = {"const", "enum", "default", "examples"}   # keywords whose values are data, not schemas


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar (llguidance's serialised form) and what it is, for messages."""

    text: str
    what: str
    styles: tuple[tuple[str, str], ...] = ()   # (tool_style, text): a tool call per way a base writes one

    @classmethod
    def json_schema(cls, schema: Any, field: str) -> "Grammar":
        """Output that is JSON valid against `schema`. `field`: the request field that carried it."""
        if not isinstance(schema, (dict, bool)):
            raise InvalidInput(f"`{field}` must be a JSON schema (an object), got {type(schema).__name__}")
        if len(json.dumps(schema)) > _MAX_SCHEMA_BYTES:
            raise InvalidInput(f"`{field}` is over {_MAX_SCHEMA_BYTES // 1024} KiB")
        from llguidance import LLMatcher

        text = _compiled(lambda: LLMatcher.grammar_from_json_schema(tightened(schema), defaults=JSON_OPTIONS),
                         field)
        return cls(text, f"the schema in {field}")

    @classmethod
    def json_object(cls, field: str) -> "Grammar":
        """Any JSON object (OpenAI's json_object mode, Ollama's format "json")."""
        return cls.json_schema({"type": "object"}, field)

    @classmethod
    def lark(cls, grammar: str, field: str) -> "Grammar":
        """A grammar in llguidance's Lark dialect (which embeds JSON schemas as `%json {…}`)."""
        from llguidance import LLMatcher

        return cls(_compiled(lambda: LLMatcher.grammar_from_lark(grammar), field), f"the grammar of {field}")

    def for_tokenizer(self, tokenizer) -> str:
        return dict(self.styles).get(tool_style(tokenizer), self.text) if self.styles else self.text

    def start(self, tokenizer, vocab_size: int, eos_ids: tuple[int, ...]) -> "GrammarState":
        return GrammarState(self, self.for_tokenizer(tokenizer), _vocabulary(tokenizer, vocab_size, eos_ids))

    def accepts(self, text: str, tokenizer) -> bool:
        """Whether `text` is a whole output of this grammar (as the tokenizer splits it)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(_any_vocabulary(tokenizer).lltokenizer, self.for_tokenizer(tokenizer), log_level=0)
        return matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting()


class GrammarState:
    """One row's place in its grammar: which tokens may come next, and the tokens taken."""

    def __init__(self, grammar: Grammar, text: str, vocabulary: _Vocabulary):
        from llguidance import LLMatcher

        self.grammar, self.vocabulary = grammar, vocabulary
        self.matcher = LLMatcher(vocabulary.lltokenizer, text, log_level=0)   # errors are read, not printed

    def allowed(self) -> torch.Tensor:
        """[vocab] bool: the tokens the grammar admits next (EOS among them where it may end)."""
        bias = self.matcher.compute_logit_bias()     # one byte per token: 0 or 200
        return torch.frombuffer(bytearray(bias), dtype=torch.uint8).ne(0)

    def mask(self, logits: torch.Tensor, closing: bool = False) -> torch.Tensor | None:
        """The row's logits with inadmissible tokens at -inf, or None when no token is admissible.
        `closing` (the row's token budget is nearly spent): of the admissible tokens, only those
        that bring the JSON nearer its end, where there are any (`closing_class`)."""
        allowed, width = self.allowed(), logits.shape[-1]
        if allowed.numel() < width:   # ids past the tokenizer's (a padded head) are never admissible
            allowed = torch.cat([allowed, allowed.new_zeros(width - allowed.numel())])
        allowed = allowed[:width]
        if not bool(allowed.any()):
            return None
        if closing:
            for closers in self.vocabulary.closers(width):
                if bool((narrowed := allowed & closers).any()):
                    allowed = narrowed
                    break
        return logits.masked_fill(~allowed.to(logits.device), float("-inf"))

    def take(self, token: int) -> bool:
        """Advance past `token`; False when the grammar refuses it (the row cannot go on)."""
        return self.matcher.consume_token(token)

    @property
    def complete(self) -> bool:
        """The output is whole: the grammar admits nothing more (only EOS)."""
        return self.matcher.is_stopped()

    def error(self) -> str:
        reason = self.matcher.get_error() or "no token of the vocabulary continues the output"
        return f"{self.grammar.what} admits no next token: {_one_line(reason)}"


def closing_window(limit: int) -> int:
    """How many tokens before its limit a constrained row starts closing its JSON: a quarter of
    the budget, 8 to 64 tokens (enough for the open strings and the required keys still owed)."""
    return min(64, max(8, limit // 4))


# What ends JSON soonest, first choice first (the classes of `closing_class`). Without this, a
# small model at temperature 1 writes a free string until max_tokens about once in 20 answers,
# and a cut answer never validates.
_OPENING = frozenset(b",:[{")
_TRAILING = frozenset(b"]} \t\r\n")


def closing_class(text: bytes) -> int | None:
    """How well a token's text ends JSON: 0, a quote that closes a string (inside one, the only
    way out; a bracket there is text), with nothing before it that opens anything and only
    closing brackets after; 1, a closing bracket; 2, a comma (the way on to a key still owed);
    None, neither. A token that closes a string and opens the next (`", "`, `,"`) is at best a
    comma: ranked as a quote, it kept an array of strings going to the limit. A backslash would
    escape a quote instead of closing on it."""
    if b"\\" in text:
        return None
    if text.count(b'"') == 1:
        before, after = text.split(b'"')
        if not _OPENING.intersection(before) and _TRAILING.issuperset(after):
            return 0
    if b'"' not in text and not _OPENING.intersection(text) and (b"}" in text or b"]" in text):
        return 1
    return 2 if b"," in text else None


class _Vocabulary:
    """llguidance's view of one tokenizer, and (built on first need) the tokens that close JSON."""

    def __init__(self, lltokenizer):
        self.lltokenizer = lltokenizer
        self._closers: dict[int, tuple[torch.Tensor, ...]] = {}

    def closers(self, width: int) -> tuple[torch.Tensor, ...]:
        """[width] bool per class of `closing_class`, best first: the tokens in it."""
        with _LOCK:
            if width not in self._closers:
                view = self.lltokenizer
                classes = [closing_class(view.decode_bytes([i])) if i < view.vocab_size else None
                           for i in range(width)]
                self._closers[width] = tuple(torch.tensor([c == rank for c in classes]) for rank in range(3))
            return self._closers[width]


# llguidance's view of a tokenizer takes ~0.3 s to build on a 49k vocabulary: one per tokenizer
# (and width and EOS ids), which lives as long as the tokenizer does.
_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def token_bytes(tokenizer, token: int) -> bytes:
    """The bytes `token` stands for (a byte-level token may hold part of a character; a special
    token, its name; an id of a padded head past the vocabulary, none: it decodes to no text)."""
    if token >= len(tokenizer):
        return b""
    return _any_vocabulary(tokenizer).lltokenizer.decode_bytes([token])


def _any_vocabulary(tokenizer) -> _Vocabulary:
    """A view of `tokenizer` for checking a text, where any width will do: a row's, if one was built."""
    with _LOCK:
        built = next(iter(_VOCABULARIES.get(tokenizer, {}).values()), None)
    if built is not None:
        return built
    eos = () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
    return _vocabulary(tokenizer, len(tokenizer), eos)


def _vocabulary(tokenizer, vocab_size: int, eos_ids: tuple[int, ...]) -> _Vocabulary:
    key = (vocab_size, tuple(eos_ids))
    with _LOCK:
        cached = _VOCABULARIES.setdefault(tokenizer, {})
        if key not in cached:
            cached[key] = _Vocabulary(_build_lltokenizer(tokenizer, vocab_size, list(eos_ids)))
        return cached[key]


def _build_lltokenizer(tokenizer, vocab_size: int, eos_ids: list[int]):
    import llguidance
    import llguidance.hf

    try:
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos_ids)
    except ValueError:
        # A tokenizer whose decoder llguidance does not know (a character-level one): describe
        # each token by the text it decodes to.
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_DecodedVocabulary(tokenizer, eos_ids)),
                                      n_vocab=vocab_size, eos_token=eos_ids)


class _DecodedVocabulary:
    """A tokenizer as llguidance's generic wrapper reads it: each token's bytes, and encode()."""

    def __init__(self, tokenizer, eos_ids: list[int]):
        self.tokenizer = tokenizer
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = sorted(set(tokenizer.all_special_ids))
        self.tokens = [tokenizer.decode([i]).encode("utf-8") for i in range(len(tokenizer))]

    def __call__(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


# Integers a schema leaves unbounded are held to JSON's safe range (JavaScript's
# Number.MAX_SAFE_INTEGER): a small model otherwise writes digits until max_tokens (the 135M base
# did in 3 of 20 answers), and no JSON reader keeps more precision than this anyway.
SAFE_INTEGER = 2**53 - 1
_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}


def tightened(schema: Any) -> Any:
    """`schema` as zenedge decodes it: every object that lists properties closed to others unless
    it says otherwise, and every unbounded integer held to ±SAFE_INTEGER."""
    if isinstance(schema, list):
        return [tightened(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: value if key in _VALUES else tightened(value) for key, value in schema.items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    if schema.get("type") == "integer" and not _BOUNDS & set(schema):
        out.update(minimum=-SAFE_INTEGER, maximum=SAFE_INTEGER)
    return out


def _compiled(build, field: str) -> str:
    """llguidance's grammar from `build`, checked: what it cannot take is an InvalidInput naming `field`."""
    from llguidance import LLMatcher

    try:
        text = build()
    except Exception as exc:   # llguidance raises ValueError with its reason
        raise InvalidInput(f"`{field}`: {_one_line(exc)}") from None
    failed, messages = LLMatcher.validate_grammar_with_warnings(text)
    if failed:
        raise InvalidInput(f"`{field}`: unsupported schema: {_one_line(messages[0])}")
    return text


def _one_line(message: Any) -> str:
    return " ".join(str(message).split())[:300]
