"""The real default pair (Qwen2.5-Coder 0.5B draft, 1.5B target), prepared from the
installed parts on first use (minutes), from the safetensors cache afterwards (seconds)."""
import pytest

from app.chat.prompt import chat_prompt_ids
from app.engine.engine import SpeculativeEngine
from app.engine.errors import ModelError
from app.engine.models.loading import load_model
from app.engine.steps import Source
from app.engine.api import LOAD_DEFAULTS
from tests.helpers import all_steps, generated_ids
from tests.tiny import tiny_model

pytestmark = pytest.mark.real

QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in two sentences what a hash map is.",
]


@pytest.fixture(scope="module")
def real_pair():
    return (load_model("default-draft", precision=LOAD_DEFAULTS.draft_precision),
            load_model("default-target", precision=LOAD_DEFAULTS.precision))


@pytest.fixture(scope="module")
def real_engine(real_pair):
    draft, target = real_pair
    return SpeculativeEngine(target, draft)


@pytest.mark.parametrize("question", QUESTIONS)
def test_greedy_speculative_equals_plain_target(real_engine, question):
    prompt = chat_prompt_ids(real_engine.target.tokenizer, [{"role": "user", "content": question}])
    plain = generated_ids(real_engine, prompt, speculative=False, max_new_tokens=48)
    steps = all_steps(real_engine, prompt, k=4, max_new_tokens=48)
    assert [t.id for s in steps for t in s.tokens] == plain
    assert len(plain) == 48
    adaptive = all_steps(real_engine, prompt, k=8, adaptive=True, max_new_tokens=48)
    assert [t.id for s in adaptive for t in s.tokens] == plain
    # A real draft from the same family agrees with its target most of the time.
    assert steps[-1].stats.acceptance_rate > 0.4
    assert {t.source for s in steps for t in s.tokens} >= {Source.ACCEPTED}


def test_default_pair_shares_a_tokenizer(real_pair):
    draft, target = real_pair
    assert len(draft.tokenizer) == len(target.tokenizer) == 151_936
    assert target.stop_tokens and target.context_length >= 32_768


def test_mismatched_vocabulary_is_refused(real_pair):
    _, target = real_pair
    with pytest.raises(ModelError, match=r"draft's tokenizer has 96 tokens, the target's 151,936"):
        SpeculativeEngine(target, tiny_model(seed=3, vocab_size=96))


def test_the_served_default_pair_answers_as_the_engine_does(real_engine):
    """`python -m app serve` as a user starts it: a streamed greedy chat completion answers 2+3
    with 5, every chunk's tokens labelled, and its tokens are the engine's plain greedy output."""
    import os
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx
    import openai

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", str(port)], cwd=Path(__file__).parents[1],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "SPECCHAT_API_KEY": ""})
    try:
        deadline = time.monotonic() + 300
        question = [{"role": "user", "content": "What is 2+3? Answer with the number only."}]
        while True:  # 503 while the models load
            assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()[-3000:]
            try:
                if httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                              json={"messages": question, "max_tokens": 1}).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        chunks = list(client.chat.completions.create(model="default", messages=question, temperature=0,
                                                     max_tokens=16, stream=True))
    finally:
        server.terminate()
        server.wait(30)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    provenance = [token for chunk in chunks if chunk.choices for token in chunk.choices[0].model_extra["provenance"]]
    assert text.strip() == "5" and provenance
    assert {token["source"] for token in provenance} <= {"accepted", "corrected", "bonus", "plain"}
    prompt = chat_prompt_ids(real_engine.target.tokenizer, question)
    assert [token["id"] for token in provenance] == generated_ids(real_engine, prompt, speculative=False,
                                                                   max_new_tokens=16)
