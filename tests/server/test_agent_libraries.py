"""What agent libraries send, against a daemon on the real default base (SmolLM2-135M-Instruct):
pydantic-ai, langchain (OpenAI and Ollama) and the official clients. Wherever the request fixes
the output (a schema, JSON mode, a required or named tool call) every answer must validate;
where the model may choose ("auto" tools), every call it makes must. A few seeded tries per case
here (the answers are reproducible, so a pass is not luck); `python -m tests.agent_libraries` runs
20 per case and prints the table (benchmarks/*-agent-libraries.md).

Near max_tokens a constrained answer is wrapped up (runtime/grammar.py closes its JSON): before
that, at the libraries' default temperature (1.0), the 135M base cut about 1 answer in 20 at 160
tokens inside a free string, which could not validate."""

from __future__ import annotations

import json

import jsonschema
import pydantic
import pytest

pytestmark = pytest.mark.slow
TRIES = 3
MODEL = "smollm2-135m"
ASK_CITY = "Tell me about Paris."
ASK_WEATHER = "What is the weather in Oslo for the next 3 days?"


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int


def weather(city: str, days: int) -> str:
    """The weather forecast for a city over some days."""
    return "sunny"


def weather_schema() -> dict:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return convert_to_openai_tool(weather)["function"]["parameters"]


@pytest.fixture(scope="module")
def urls(real_daemon):
    return {"v1": f"{real_daemon.tcp_url}/v1", "api": real_daemon.tcp_url, "token": real_daemon.token}


def chat_openai(urls, seed=0):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=urls["v1"], api_key=urls["token"], max_tokens=160, max_retries=0,
                      seed=seed)


def chat_ollama(urls, seed=0):
    from langchain_ollama import ChatOllama

    return ChatOllama(model=MODEL, base_url=urls["api"], num_predict=160, seed=seed,
                      client_kwargs={"headers": {"Authorization": f"Bearer {urls['token']}"}})


# Not ChatOllama with method="function_calling": Ollama's API has no tool_choice, so nothing there
# requires a call (the model may answer in text, and langchain then returns None).
@pytest.mark.parametrize(("chat", "method"), [(chat_openai, "json_schema"), (chat_openai, "function_calling"),
                                              (chat_ollama, "json_schema")],
                         ids=["openai-json_schema", "openai-function_calling", "ollama-json_schema"])
def test_langchain_with_structured_output(urls, chat, method):
    for seed in range(TRIES):
        assert isinstance(chat(urls, seed).with_structured_output(City, method=method).invoke(ASK_CITY), City)


@pytest.mark.parametrize("chat", [chat_openai, chat_ollama], ids=["openai", "ollama"])
def test_langchain_json_mode_parses(urls, chat):
    for seed in range(TRIES):
        structured = chat(urls, seed).with_structured_output(None, method="json_mode")
        assert isinstance(structured.invoke(ASK_CITY + " Answer in JSON."), dict)


def test_langchain_bind_tools(urls):
    schema = weather_schema()
    for seed in range(TRIES):
        calls = chat_openai(urls, seed).bind_tools([weather], tool_choice="any").invoke(ASK_WEATHER).tool_calls
        assert len(calls) == 1 and calls[0]["name"] == "weather"
        jsonschema.validate(calls[0]["args"], schema)
    for chat in (chat_openai, chat_ollama):     # "auto": whatever calls the model makes validate
        for call in chat(urls).bind_tools([weather]).invoke(ASK_WEATHER).tool_calls:
            assert call["name"] == "weather"
            jsonschema.validate(call["args"], schema)


@pytest.mark.parametrize("provider", ["openai", "ollama"])
def test_pydantic_ai_output_types(urls, provider):
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.ollama import OllamaProvider
    from pydantic_ai.providers.openai import OpenAIProvider

    made = {"openai": OpenAIProvider, "ollama": OllamaProvider}[provider](base_url=urls["v1"], api_key=urls["token"])
    model = OpenAIChatModel(MODEL, provider=made)
    for output in (City, NativeOutput(City)):     # a required tool call; response_format json_schema
        agent = Agent(model, output_type=output, retries=0)
        for seed in range(TRIES):
            answer = agent.run_sync(ASK_CITY, model_settings={"max_tokens": 160, "seed": seed})
            assert isinstance(answer.output, City)


def test_the_official_clients(urls):
    import ollama
    import openai

    client = openai.OpenAI(base_url=urls["v1"], api_key=urls["token"], max_retries=0)
    tool = {"type": "function", "function": {"name": "weather", "description": weather.__doc__,
                                             "parameters": weather_schema()}}
    for seed in range(TRIES):
        parsed = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": ASK_CITY}],
                                               response_format=City, max_tokens=160, seed=seed)
        assert isinstance(parsed.choices[0].message.parsed, City)
        called = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK_WEATHER}],
                                                tools=[tool], tool_choice="required", max_tokens=160,
                                                seed=seed).choices[0]
        assert called.finish_reason == "tool_calls"
        jsonschema.validate(json.loads(called.message.tool_calls[0].function.arguments), weather_schema())
    local = ollama.Client(host=urls["api"], headers={"Authorization": f"Bearer {urls['token']}"})
    for seed in range(TRIES):
        reply = local.chat(model=MODEL, messages=[{"role": "user", "content": ASK_CITY}],
                           format=City.model_json_schema(), options={"num_predict": 160, "seed": seed})
        City.model_validate_json(reply.message.content)
