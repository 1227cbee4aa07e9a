"""Embeddings: the runtime's pooling (runtime/embed.py) against a reference computed by hand from
the model's hidden states, and /v1/embeddings through the official `openai` client."""

from __future__ import annotations

import base64
import struct

import openai
import pytest
import torch

from zenedge.errors import InvalidInput
from zenedge.runtime import embed
from zenedge.runtime.embed import EmbeddingLimits, Embedder, embed_ids, micro_batches, tokenize


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_base_dir):
    """An engine over a home with the tiny base (int4 decode copies: embeddings must not use them)
    and the LoRA profiles p0..p3."""
    from tests.server.harness import make_home
    from zenedge import config
    from zenedge.runtime.engine import Engine
    from zenedge.store import Store

    home, config_path = make_home(tmp_path_factory.mktemp("embed"), tiny_base_dir,
                                  config={"runtime": {"weights": "int4"}})
    return Engine(Store(home), config.load(config_path))


def reference(resident, variant, text: str) -> torch.Tensor:
    """The definition, one text at a time: mean over positions of the final (normed) hidden
    state, with the variant applied on the plain weights, scaled to unit length."""
    ids = torch.tensor([tokenize(resident, [text], 10**6, False)[0]])
    with torch.inference_mode(), resident.state.using([variant], plain=True):
        states = resident.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
    mean = states.float().mean(dim=0)
    return mean / mean.norm()


TEXTS = ["hello there", "a", "a rather longer text, to pad the others in its batch"]


@pytest.mark.parametrize("model", ["tiny", "p0"])
def test_vectors_are_the_normalised_mean_of_the_last_hidden_state(engine, model):
    route = engine.router.route(model)
    resident, variant = engine.resident(route.base), engine.variant(route)
    assert resident.weights == "int4"
    vectors = embed_ids(resident, variant, tokenize(resident, TEXTS, 1000, False))
    for vector, text in zip(vectors, TEXTS):
        assert torch.allclose(vector, reference(resident, variant, text), atol=1e-5)
    assert torch.allclose(vectors.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-6)


def test_a_vector_does_not_depend_on_its_batch(engine):
    route = engine.router.route("p1")
    resident, variant = engine.resident(route.base), engine.variant(route)
    ids = tokenize(resident, TEXTS, 1000, False)
    together = embed_ids(resident, variant, ids)
    alone = torch.cat([embed_ids(resident, variant, [one]) for one in ids])
    reversed_order = embed_ids(resident, variant, ids[::-1]).flip(0)
    tiny_batches = embed_ids(resident, variant, ids, batch_tokens=1)  # one text per forward
    for other in (alone, reversed_order, tiny_batches):
        assert torch.allclose(together, other, atol=1e-5)


def test_profiles_embed_differently_from_their_base(engine):
    vectors = {}
    for model in ("tiny", "p0", "p1"):
        route = engine.router.route(model)
        resident = engine.resident(route.base)
        vectors[model] = embed_ids(resident, engine.variant(route), tokenize(resident, ["same text"], 100, False))[0]
    assert not torch.allclose(vectors["tiny"], vectors["p0"], atol=1e-3)
    assert not torch.allclose(vectors["p0"], vectors["p1"], atol=1e-3)


def test_micro_batches_bound_the_padded_tokens():
    lengths = [5, 100, 3, 40, 40, 7, 300]
    groups = micro_batches(lengths, batch_tokens=120)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= 120
    assert [300] in [[lengths[i] for i in g] for g in groups]  # too long for any batch: alone


def test_limits(engine):
    embedder = Embedder(engine, EmbeddingLimits(max_tokens=10))
    route = engine.router.route("p0")
    with pytest.raises(InvalidInput, match="input 1 is empty"):
        embedder.embed(route, ["fine", ""])
    with pytest.raises(InvalidInput, match="11 tokens; the limit is 10"):
        embedder.embed(route, ["x" * 11])
    cut = embedder.embed(route, ["x" * 11, "y" * 3], truncate=True)
    assert cut.token_counts == [10, 3]
    assert torch.allclose(cut.vectors[0], embedder.embed(route, ["x" * 10]).vectors[0], atol=1e-6)
    with pytest.raises(InvalidInput, match="at most 64"):
        embedder.embed(route, ["x"], dimensions=65)
    short = embedder.embed(route, ["x"], dimensions=8).vectors
    assert short.shape == (1, 8) and torch.allclose(short.norm(dim=1), torch.ones(1))
    assert embed.context_length(engine.resident("tiny")) == 128  # the default limit is lowered to it


# -- /v1/embeddings ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(daemon):
    return openai.OpenAI(base_url=f"{daemon.tcp_url}/v1", api_key=daemon.token, max_retries=0)


def test_openai_client_embeddings(client):
    # The SDK asks for base64 unless told otherwise, and decodes it: both must give the same vectors.
    packed = client.embeddings.create(model="p0", input=["hello there", "general kenobi"])
    floats = client.embeddings.create(model="p0", input=["hello there", "general kenobi"], encoding_format="float")
    assert [d.index for d in packed.data] == [0, 1] and packed.model == "p0"
    for a, b in zip(packed.data, floats.data):
        assert len(a.embedding) == 64 and a.embedding == pytest.approx(b.embedding, abs=1e-6)
    assert packed.usage.prompt_tokens == packed.usage.total_tokens == len("hello there") + len("general kenobi")
    single = client.embeddings.create(model="p0", input="general kenobi", encoding_format="float")
    assert single.data[0].embedding == pytest.approx(floats.data[1].embedding, abs=1e-5)
    short = client.embeddings.create(model="tiny", input="hi", dimensions=16, encoding_format="float")
    assert len(short.data[0].embedding) == 16


def test_base64_is_little_endian_float32(daemon):
    with daemon.uds() as http:
        body = {"model": "p1", "input": "bytes"}
        packed = http.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
        floats = http.post("/v1/embeddings", json=body).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert len(raw) == 64 * 4
    assert list(struct.unpack("<64f", raw)) == pytest.approx(floats["data"][0]["embedding"], abs=1e-6)


def test_embedding_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="ghost", input="hi")
    with pytest.raises(openai.BadRequestError, match="limit is 128"):  # tokens per input: the context length
        client.embeddings.create(model="p0", input="x" * 129)
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.embeddings.create(model="p0", input="")
    for ids in ([[1, 2, 3]], [5, 6]):  # token ids belong to the client's tokenizer (tiktoken's), not the model's
        with pytest.raises(openai.BadRequestError, match="`input` holds token ids"):
            client.embeddings.create(model="p0", input=ids)
    with pytest.raises(openai.UnprocessableEntityError):  # too many inputs
        client.embeddings.create(model="p0", input=["x"] * 257)
