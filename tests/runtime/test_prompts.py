"""Prompts through the base's chat template, and the documented plain prompt for a base that has
none (a GGUF without `tokenizer.chat_template`): it answers, and says so once."""

import logging

from tests.conftest import tiny_tokenizer
from zenedge.runtime.engine import Prompt
from zenedge.runtime.generate import SamplingParams
from zenedge.runtime.prompts import PLAIN_STOP, chat_ids, plain_chat

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "tool", "content": "42"},
            {"role": "user", "content": "and?"}]


def test_the_plain_prompt_is_a_line_per_turn_ending_with_the_assistants_label():
    assert plain_chat(MESSAGES) == "be brief\n\nUser: hi\nAssistant: hello\nTool: 42\nUser: and?\nAssistant:"
    assert plain_chat(MESSAGES[:2], add_generation_prompt=False) == "be brief\n\nUser: hi\n"


def test_a_tokenizer_with_a_template_renders_it():
    tokenizer = tiny_tokenizer()
    text = tokenizer.decode(chat_ids(tokenizer, MESSAGES[:2]))
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_without_a_template_the_plain_prompt_is_used_and_said_once(caplog):
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    with caplog.at_level(logging.WARNING, logger="zenedge.runtime"):
        first = chat_ids(tokenizer, MESSAGES)
        again = chat_ids(tokenizer, MESSAGES[:2])
    assert tokenizer.decode(first) == plain_chat(MESSAGES)
    assert tokenizer.decode(again) == plain_chat(MESSAGES[:2])
    assert [r.getMessage() for r in caplog.records].count(
        "this base's tokenizer has no chat template: chats use zenedge's plain prompt (User: … / Assistant:)") == 1


def test_a_base_without_a_template_answers_a_chat_and_stops_before_a_user_line(engine):
    engine.resident("tiny").tokenizer.chat_template = None
    chat = Prompt(messages=[{"role": "user", "content": "hi"}])
    out = engine.complete("tiny", chat, SamplingParams(max_tokens=6))
    assert out.prompt_tokens == len("User: hi\nAssistant:") and out.completion_tokens > 0
    route, resident = engine.router.route("tiny"), engine.resident("tiny")
    asked = SamplingParams(max_tokens=6, stop=("x",))
    assert engine.request(route, resident, chat, asked).params.stop == ("x", PLAIN_STOP)
    assert engine.request(route, resident, Prompt(text="User: hi"), asked).params.stop == ("x",)   # raw text
