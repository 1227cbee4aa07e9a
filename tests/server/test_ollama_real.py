"""The Ollama API on the real default base (SmolLM2-135M-Instruct): what a Hanzo node pointed at
zenedge gets from its embeddings_server_url."""

from __future__ import annotations

import httpx
import ollama
import pytest


pytestmark = pytest.mark.slow

# Four pairs of paraphrases: each text's nearest neighbour should be its partner.
PAIRS = [("The cat sat on the mat.", "A kitten was sitting on the rug."),
         ("Quarterly revenue rose by eight percent.", "The stock market fell sharply today."),
         ("How do I bake sourdough bread?", "What is a good recipe for homemade bread?"),
         ("Python lists are mutable sequences.", "In Python, a list can be changed after it is created.")]


def test_node_embeddings_on_the_real_base(real_daemon):
    client = ollama.Client(host=real_daemon.tcp_url, headers={"Authorization": f"Bearer {real_daemon.token}"})
    shown = client.show("smollm2-135m:latest")
    assert shown.modelinfo["llama.embedding_length"] == 576 and shown.modelinfo["llama.context_length"] == 8192
    assert shown.details.parameter_size.endswith("M") and "embedding" in shown.capabilities
    texts = [text for pair in PAIRS for text in pair]
    vectors = client.embed(model="smollm2-135m", input=texts).embeddings
    assert len(vectors) == 8 and all(len(v) == 576 for v in vectors)
    for i, vector in enumerate(vectors):
        similarity = [sum(a * b for a, b in zip(vector, other)) if j != i else -1.0 for j, other in enumerate(vectors)]
        assert similarity.index(max(similarity)) == i ^ 1, (texts[i], similarity)  # its partner: 0<->1, 2<->3, …
    node = httpx.post(f"{real_daemon.tcp_url}/api/embeddings", json={"model": "smollm2-135m", "prompt": texts[0]},
                      headers={"Authorization": f"Bearer {real_daemon.token}"})
    assert node.json()["embedding"] == pytest.approx(vectors[0], abs=1e-5)
    with pytest.raises(ollama.ResponseError) as missing:  # Hanzo's default model is Ollama's, not ours
        client.embed(model="snowflake-arctic-embed:xs", input="hi")
    assert missing.value.status_code == 404
    answer = client.chat(model="smollm2-135m", messages=[{"role": "user", "content": "Say hello."}],
                         options={"num_predict": 8, "temperature": 0})
    assert answer.done and answer.message.content.strip() and answer.eval_count <= 8
