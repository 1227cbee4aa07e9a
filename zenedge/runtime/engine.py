"""The engine: resident bases, the delta cache and the router behind one small API that the CLI,
the daemon and the benchmarks share."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator, Sequence

from zenedge import bases
from zenedge.config import Config
from zenedge.errors import InvalidInput
from zenedge.runtime import cpu_weights, threads
from zenedge.runtime import tools as calling
from zenedge.runtime.cache import DeltaCache
from zenedge.runtime.decode import decode_path
from zenedge.runtime.dense_bitdelta import DenseBitDeltas
from zenedge.runtime.device import pick_device, pick_dtype, pick_weights
from zenedge.runtime.generate import Delta, GenerationRequest, SamplingParams, check_fits, generate
from zenedge.runtime.model import ResidentModel, load_resident
from zenedge.runtime.resident_file import ResidentCache
from zenedge.runtime.prompts import PLAIN_STOP, chat_ids, check_messages, encode_chat, encode_text, has_chat_template
from zenedge.runtime.router import Route, Router
from zenedge.runtime.variants import Variant, load_bitdelta, load_lora
from zenedge.store import Store

log = logging.getLogger("zenedge.runtime")

@dataclass
class Prompt:
    """What a request asks for: chat messages (templated) or raw text."""

    messages: Sequence[dict] | None = None
    text: str | None = None
    tools: Sequence[dict] = ()   # OpenAI's shape, {"type": "function", "function": {...}}

    def encode(self, tokenizer) -> list[int]:
        if self.messages is not None:
            if self.tools or any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls"))
                                 for m in self.messages):
                check_messages(self.messages)   # as sent; what the template gets is built from them
                messages, passed = calling.messages_for_template(tokenizer, self.messages, self.tools)
                return chat_ids(tokenizer, messages, tools=passed)
            return encode_chat(tokenizer, self.messages)
        if self.text is not None:
            return encode_text(tokenizer, self.text)
        raise InvalidInput("a request needs messages or a prompt")


@dataclass
class Completion:
    model: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class Engine:
    def __init__(self, store: Store, cfg: Config, progress: Callable[[str], None] | None = None, *,
                 scoring_only: bool = False):
        """`scoring_only`: this engine only reads text teacher-forced (the pool's quality gate in a
        CLI process), which runs on the plain weights: no decode-format copies are made (their
        conversion costs time and memory the process would never use)."""
        self.store = store
        self.use_config(cfg)
        self.threads = threads.configure(cfg.runtime.threads)
        self.device = pick_device(cfg.runtime.device)
        self.dtype = pick_dtype(cfg.runtime.dtype, self.device)
        self.weights = "full" if scoring_only else pick_weights(cfg.runtime.weights, self.device)
        self.cache = DeltaCache(cfg.runtime.cache_budget, pinned=self.pinned_ids)
        self.dense = DenseBitDeltas(self.cache)
        self.router = Router(store)
        self.progress = progress
        self._residents: dict[str, ResidentModel] = {}
        self._resident_lock = threading.Lock()

    def use_config(self, cfg: Config) -> None:
        """The config in force (at start, and after a reload): the settings read per request come
        from it; the int4 kernel's rounding of inputs is set here."""
        self.cfg = cfg
        cpu_weights.set_activations(cfg.runtime.activations)

    def pinned_ids(self) -> set[str]:
        """Adapters the cache must keep: the store's answer, with the config in force (reloads included)."""
        return self.store.pinned_ids(self.cfg.runtime.pinned)

    # -- loading -------------------------------------------------------------------------------
    def loaded(self, base: str) -> bool:
        """Whether `base` is resident already (`resident` would not load it)."""
        return base in self._residents

    def resident(self, base: str) -> ResidentModel:
        with self._resident_lock:  # single-flight: one load per base, others wait
            if base not in self._residents:
                row = bases.ensure_base(self.store, base, progress=self.progress)
                bases.verify_weights(self.store, row)
                directory = self.store.home / row["dir"]
                cache = ResidentCache(directory / "resident", row.get("weights_sha256") or row["sha256"])
                self._residents[base] = load_resident(row["name"], directory, self.device, self.dtype, self.weights,
                                                      cache)
            return self._residents[base]

    def variant(self, route: Route) -> Variant | None:
        if route.adapter is None:
            return None
        adapter = route.adapter
        variant = self.cache.get(adapter["id"], lambda: self._load_variant(adapter), name=route.name)
        return self.dense.prepare(variant, self.resident(route.base).model, self.cfg.runtime.bitdelta_dense)

    def _load_variant(self, adapter: dict[str, Any]) -> Variant:
        """A stored adapter in memory, from a blob that still matches its digest and holds finite
        numbers only: a damaged file is refused with one line naming the profile, never served."""
        path = self.store.verified_blob(adapter["sha256"])
        if adapter["kind"] == "bitdelta":
            variant = load_bitdelta(adapter["id"], path, self.device)
        else:
            variant = load_lora(adapter["id"], adapter["kind"], path, adapter["config"], self.device, self.dtype)
        if not variant.finite():
            raise self.store.damaged(adapter["sha256"], "it holds non-finite numbers")
        return variant

    # -- generation ----------------------------------------------------------------------------
    def request(self, route: Route, resident: ResidentModel, prompt: Prompt, params: SamplingParams,
                cancelled: threading.Event | None = None) -> GenerationRequest:
        """`prompt` for `route` on its resident base as a generation request: encoded, checked
        against the context before the variant is loaded, and counted. The one preparation of the
        engine's own calls and the daemon's scheduler."""
        input_ids = prompt.encode(resident.tokenizer)
        check_fits(resident, input_ids)
        if prompt.messages is not None and not has_chat_template(resident.tokenizer):
            params = replace(params, stop=(*params.stop, PLAIN_STOP))   # the plain prompt's next turn
        request = GenerationRequest(input_ids, self.variant(route), params, cancelled)
        self.record_request(route)
        return request

    def record_request(self, route: Route) -> None:
        """Count a request (a generation, an embedding) in the pool's eviction order. Statistics
        never fail a request: a failed write is logged."""
        if route.adapter is None:
            return
        try:
            self.store.record_requests(route.adapter["id"])
        except Exception as exc:
            log.warning("could not record a request for %s: %s", route.name, exc)

    def _prepare(self, name: str, prompt: Prompt, params: SamplingParams) -> tuple[Route, ResidentModel, GenerationRequest]:
        route = self.router.route(name)
        resident = self.resident(route.base)
        return route, resident, self.request(route, resident, prompt, params)

    def stream(self, name: str, prompt: Prompt, params: SamplingParams = SamplingParams()) -> Iterator[Delta]:
        """One request, streamed: yields each step's Delta (text may be empty while holding back)."""
        route, resident, request = self._prepare(name, prompt, params)
        with self.router.inflight(route):
            for deltas in generate(resident, [request]):
                yield from deltas

    def complete(self, name: str, prompt: Prompt, params: SamplingParams = SamplingParams()) -> Completion:
        return self.complete_batch([(name, prompt, params)])[0]

    def complete_batch(self, items: Sequence[tuple[str, Prompt, SamplingParams]]) -> list[Completion]:
        """Several requests, possibly for different variants of one base, in one batch."""
        prepared = [self._prepare(name, prompt, params) for name, prompt, params in items]
        residents = {id(r) for _, r, _ in prepared}
        if len(residents) != 1:
            raise InvalidInput("a batch must use variants of one base")
        resident = prepared[0][1]
        texts = [""] * len(items)
        tokens = [0] * len(items)
        reasons = ["length"] * len(items)
        for deltas in generate(resident, [request for _, _, request in prepared]):
            for delta in deltas:
                texts[delta.index] += delta.text
                tokens[delta.index] += 1
                if delta.finish_reason:
                    reasons[delta.index] = delta.finish_reason
        return [Completion(name, texts[i], len(prepared[i][2].input_ids), tokens[i], reasons[i])
                for i, (name, _, _) in enumerate(items)]

    def ps(self) -> dict[str, Any]:
        return {
            "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""), "weights": self.weights,
            "bases": [{"name": r.name, "load_seconds": r.load_seconds,
                       "decode": asdict(decode_path(r.model, r.device, r.weights, r.graphs))}
                      for r in self._residents.values()],
            "cache_budget_bytes": self.cache.budget, "cache_used_bytes": self.cache.used_bytes,
            "variants": self.cache.snapshot(), "inflight": self.router.inflight_counts(),
            "threads": self.threads.report(single_step=any(r.state.native_steps for r in self._residents.values())
                                           if self._residents else None),
        }
