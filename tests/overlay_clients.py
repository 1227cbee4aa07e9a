"""The agent libraries that cannot share the test venv (tests/overlay-requirements.txt: instructor,
litellm, hanzo-llm, llama-index), each case tried over seeds against a running daemon. Run with
the overlay first on PYTHONPATH, as tests/server/test_overlay_libraries.py does; prints one JSON
line per case: {"case", "valid", "tries", "failures", "seconds"}.

    PYTHONPATH=.overlay python tests/overlay_clients.py --v1 URL/v1 --api URL --token T --seeds 3

"Valid" is what the library accepts (a pydantic instance it built, a dict it parsed), and a
tool call whose arguments validate against the function's schema. Imports nothing of zenedge.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import jsonschema
import pydantic

MODEL = "smollm2-135m"
ASK_CITY = "Tell me about Paris."
ASK_WEATHER = "What is the weather in Oslo for the next 3 days?"
MAX_TOKENS = 160
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city", "days"]}
WEATHER_TOOL = {"type": "function", "function": {"name": "weather", "description": "the forecast for a city",
                                                 "parameters": WEATHER}}


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int


def city(value: object) -> City:
    if not isinstance(value, City):
        raise TypeError(f"not a City: {value!r}"[:200])
    return value


def weather_call(name: str, arguments: str | dict) -> dict:
    if name != "weather":
        raise ValueError(f"called {name!r}")
    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(parsed, WEATHER)
    return parsed


def cases(v1: str, api: str, token: str) -> dict[str, Callable[[int], object]]:
    import instructor
    import litellm
    import llm as hanzo_llm   # hanzo-llm installs the module `llm` (a litellm fork)
    import openai
    from llama_index.core.prompts import PromptTemplate
    from llama_index.llms.ollama import Ollama
    from llama_index.llms.openai_like import OpenAILike

    client = openai.OpenAI(base_url=v1, api_key=token, max_retries=0)
    ask = [{"role": "user", "content": ASK_CITY}]

    def instructor_mode(mode) -> Callable[[int], object]:
        patched = instructor.from_openai(client, mode=mode)

        def attempt(seed: int) -> object:
            if mode == instructor.Mode.RESPONSES_TOOLS:   # the Responses API has no seed: sampled all the same
                return city(patched.responses.create(model=MODEL, input=ASK_CITY, response_model=City,
                                                     max_output_tokens=MAX_TOKENS, max_retries=1))
            return city(patched.chat.completions.create(model=MODEL, messages=ask, response_model=City, seed=seed,
                                                        max_tokens=MAX_TOKENS, max_retries=1))
        return attempt

    def litellm_format(module, prefix: str, base: str) -> Callable[[int], object]:
        def attempt(seed: int) -> object:
            answer = module.completion(model=f"{prefix}/{MODEL}", api_base=base, api_key=token, messages=ask,
                                       response_format=City, seed=seed, max_tokens=MAX_TOKENS)
            return City.model_validate_json(answer.choices[0].message.content)
        return attempt

    def litellm_tools(module, prefix: str, base: str) -> Callable[[int], object]:
        def attempt(seed: int) -> object:
            answer = module.completion(model=f"{prefix}/{MODEL}", api_base=base, api_key=token, seed=seed,
                                       messages=[{"role": "user", "content": ASK_WEATHER}], tools=[WEATHER_TOOL],
                                       tool_choice="required", max_tokens=MAX_TOKENS)
            calls = answer.choices[0].message.tool_calls or []
            if not calls:
                raise ValueError("no tool call")
            return [weather_call(c.function.name, c.function.arguments) for c in calls]
        return attempt

    def llama_openai(seed: int) -> object:
        model = OpenAILike(model=MODEL, api_base=v1, api_key=token, is_chat_model=True,
                           is_function_calling_model=True, max_tokens=MAX_TOKENS, additional_kwargs={"seed": seed})
        return city(model.structured_predict(City, PromptTemplate(ASK_CITY)))

    def llama_ollama(seed: int) -> object:
        model = Ollama(model=MODEL, base_url=api, headers={"Authorization": f"Bearer {token}"}, request_timeout=120,
                       additional_kwargs={"seed": seed, "num_predict": MAX_TOKENS})
        return city(model.structured_predict(City, PromptTemplate(ASK_CITY)))

    return {
        "instructor TOOLS": instructor_mode(instructor.Mode.TOOLS),
        "instructor JSON_SCHEMA": instructor_mode(instructor.Mode.JSON_SCHEMA),
        "instructor RESPONSES_TOOLS": instructor_mode(instructor.Mode.RESPONSES_TOOLS),
        "litellm openai/ response_format": litellm_format(litellm, "openai", v1),
        "litellm openai/ tool_choice=required": litellm_tools(litellm, "openai", v1),
        "litellm ollama_chat/ response_format": litellm_format(litellm, "ollama_chat", api),
        "hanzo-llm openai/ response_format": litellm_format(hanzo_llm, "openai", v1),
        "hanzo-llm openai/ tool_choice=required": litellm_tools(hanzo_llm, "openai", v1),
        "llama-index OpenAILike structured_predict": llama_openai,
        "llama-index Ollama structured_predict": llama_ollama,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--v1", required=True)
    parser.add_argument("--api", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--case", default="", help="only the cases whose name contains this")
    args = parser.parse_args()
    for name, attempt in cases(args.v1, args.api, args.token).items():
        if args.case not in name:
            continue
        valid, failures, began = 0, [], time.perf_counter()
        for seed in range(args.seeds):
            try:
                attempt(seed)
                valid += 1
            except Exception as exc:   # the library refused the answer: count it, say why
                failures.append(f"seed {seed}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
        print(json.dumps({"case": name, "valid": valid, "tries": args.seeds, "failures": failures,
                          "seconds": time.perf_counter() - began}), flush=True)


if __name__ == "__main__":
    main()
