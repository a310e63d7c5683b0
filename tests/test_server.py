"""The OpenAI-compatible server, real: uvicorn on a free loopback port, our engine on tiny models,
asked by the official `openai` package and by raw HTTP."""
import json
import threading
import time

import httpx
import pytest

from app.chat.prompt import chat_prompt_ids
from app.engine.api import GenerationOptions, SpeculativeEngine, Turns
from app.serve.guard import Access, is_loopback
from app.serve.server import ServerState
from tests.running_server import RunningServer
from tests.tiny import tiny_model

uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

QUESTION = [{"role": "user", "content": "t5 t9 t2 t7"}]


@pytest.fixture
def serve():
    running = []

    def start(engine, key=None, queue=16, **defaults):
        options = GenerationOptions(k=3, adaptive=False, max_new_tokens=24, **defaults)
        running.append(RunningServer(ServerState(lambda: engine, "tiny", options, Access(key), Turns(queue))))
        return running[-1]

    yield start
    for server in running:
        server.stop()


@pytest.fixture(scope="module")
def engine():
    target = tiny_model(seed=1, context=4096)
    return SpeculativeEngine(target, tiny_model(seed=1, context=4096))  # the same weights: drafts accepted


def plain_ids(engine, prompt_ids, max_new_tokens=24):
    """The engine's own plain output, asked directly once the server's last answer has let go of it
    (a response goes out with its last step, a moment before the engine's thread ends)."""
    assert engine._busy.acquire(timeout=10)
    engine._busy.release()
    options = GenerationOptions(speculative=False, max_new_tokens=max_new_tokens)
    return [token.id for step in engine.generate(prompt_ids, options) for token in step.tokens]


def sse(response) -> list[dict]:
    """The chunks of a raw event stream, checked to end with [DONE]."""
    events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def test_greedy_chat_over_the_api_is_the_engines_plain_output_and_says_where_each_token_came_from(engine, serve):
    server = serve(engine)
    answer = server.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=24)
    provenance = answer.choices[0].model_extra["provenance"]
    expected = plain_ids(engine, chat_prompt_ids(engine.target.tokenizer, QUESTION))
    assert [token["id"] for token in provenance] == expected
    assert answer.choices[0].message.content == "".join(token["text"] for token in provenance)
    assert {token["source"] for token in provenance} <= {"accepted", "corrected", "bonus", "plain"}
    assert "accepted" in {token["source"] for token in provenance}
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 24
    metrics = answer.model_extra["metrics"]["speculative_decoding"]
    assert metrics["num_accepted_draft_tokens"] == sum(token["source"] == "accepted" for token in provenance)
    assert sum(metrics["per_step_accepted"]) == metrics["num_accepted_draft_tokens"]


def test_a_stream_has_one_chunk_per_step_and_the_same_text(engine, serve):
    server = serve(engine)
    whole = server.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=24)
    chunks = list(server.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=0,
                                                          max_tokens=24, stream=True,
                                                          stream_options={"include_usage": True}))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices
    steps = [chunk.choices[0].model_extra["provenance"] for chunk in chunks if chunk.choices]
    metrics = chunks[-2].model_extra["metrics"]["speculative_decoding"]
    drafting_steps = [step for step in steps if step and step[-1]["source"] in ("corrected", "bonus")]
    # each drafting step ends in the one token the target added: corrected, or bonus when all were accepted
    assert len(drafting_steps) == metrics["num_spec_steps"] == len(metrics["per_step_drafted"])
    assert [sum(t["source"] == "accepted" for t in step) for step in drafting_steps] == metrics["per_step_accepted"]


def test_raw_sse_and_a_token_id_prompt(engine, serve):
    server = serve(engine)
    prompt = [5, 9, 2, 7, 5, 9]
    with httpx.stream("POST", f"{server.url}/v1/completions", json={
            "prompt": prompt, "temperature": 0, "max_tokens": 16, "stream": True}, timeout=30) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        chunks = sse(response)
    ids = [token["id"] for chunk in chunks for token in chunk["choices"][0]["provenance"]]
    assert ids == plain_ids(engine, prompt, 16)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "speculative_decoding" in chunks[-1]["metrics"]


def test_stop_strings_end_the_answer_before_them(engine, serve):
    server = serve(engine)
    full = server.client().completions.create(model="tiny", prompt="t5 t9 t2", temperature=0, max_tokens=24)
    text = full.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 4]
    assert stop.strip()
    cut = server.client().completions.create(model="tiny", prompt="t5 t9 t2", temperature=0, max_tokens=24, stop=stop)
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = server.client().completions.create(model="tiny", prompt="t5 t9 t2", temperature=0, max_tokens=24,
                                                  stop=[stop], stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == cut.choices[0].text


def test_bad_requests_get_openai_errors_with_their_status(engine, serve):
    server = serve(engine)
    post = lambda body, **kwargs: httpx.post(f"{server.url}/v1/chat/completions", timeout=30, **kwargs,
                                             **({"json": body} if body is not None else
                                                {"headers": {"content-type": "application/json"}}))
    for body, param in [({"messages": QUESTION, "temperature": 5}, "temperature"), ({"messages": QUESTION, "n": 2}, "n"),
                        ({"messages": []}, "messages"), ({"messages": QUESTION, "top_p": 0}, "top_p")]:
        response = post(body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    assert post(None, content=b"[1, 2]").status_code == 400  # JSON, but not an object
    assert post(None, content=b"{nope").status_code == 400
    too_long = [{"role": "user", "content": " ".join(["t5"] * 5000)}]
    response = post({"messages": too_long})
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert post(None, content=b"x" * (5 * 2**20)).status_code == 413
    out_of_range = httpx.post(f"{server.url}/v1/completions", json={"prompt": [5, 96]}, timeout=30)
    assert out_of_range.status_code == 400
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=-1)


def test_messages_the_models_chat_template_refuses_get_400(engine, serve, monkeypatch):
    """Templates enforce their own rules (roles in order, a system message first): a 400 naming
    the template's reason, not a 500."""
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first message must be the user') }}" \
               "{% endif %}{% for m in messages %}{{ m['content'] }} {% endfor %}"
    monkeypatch.setattr(engine.target.tokenizer, "chat_template", template)
    server = serve(engine)
    response = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                          json={"messages": [{"role": "assistant", "content": "t1"}]})
    assert response.status_code == 400 and "the first message must be the user" in response.json()["error"]["message"]
    assert server.client().chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2).choices


def test_a_wrong_key_gets_401_and_models_not_loaded_503(engine, serve):
    keyed = serve(engine, key="secret")
    with pytest.raises(openai.AuthenticationError):
        keyed.client("wrong").models.list()
    assert [model.id for model in keyed.client("secret").models.list()] == ["tiny"]
    loading = serve(None)
    with pytest.raises(openai.InternalServerError) as refused:
        loading.client().chat.completions.create(model="tiny", messages=QUESTION)
    assert refused.value.status_code == 503


def test_a_full_queue_gets_429_and_a_client_that_leaves_frees_the_engine(engine, serve):
    """One answer runs, one waits, a third is refused with Retry-After; the running one's client
    leaves mid-stream, and the waiting one starts within a step."""
    server = serve(engine, queue=1)
    queue = server.state.turns
    long = {"messages": QUESTION, "temperature": 0, "max_tokens": 3500, "stream": True}
    with httpx.Client(timeout=60) as first_client:
        with first_client.stream("POST", f"{server.url}/v1/chat/completions", json=long) as first:
            lines = first.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            waiting = {}
            second = threading.Thread(target=lambda: waiting.update(response=httpx.post(
                f"{server.url}/v1/chat/completions", json={**long, "stream": False, "max_tokens": 8}, timeout=60)))
            second.start()
            deadline = time.monotonic() + 10
            while queue.waiting < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            refused = httpx.post(f"{server.url}/v1/chat/completions", json=long, timeout=30)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "queue_full"
        left = time.monotonic()  # the first client closed its stream here
    second.join(30)
    assert waiting["response"].status_code == 200 and waiting["response"].json()["usage"]["completion_tokens"] == 8
    assert time.monotonic() - left < 10  # not after the first answer's 3,500 tokens
    deadline = time.monotonic() + 5  # the engine's thread ends just after the step the answer ended with
    while engine._busy.locked():
        assert time.monotonic() < deadline, "the engine stayed busy"
        time.sleep(0.01)
    assert queue.waiting == 0


def test_concurrent_clients_are_each_served_or_refused_and_memory_stays_flat(engine, serve):
    """24 clients at once, three times: each is answered or told 429; the process holds no more
    after the third load than after the first."""
    import gc

    import psutil

    server = serve(engine, queue=8)

    def load() -> list:
        results = []

        def ask() -> None:
            try:
                response = httpx.post(f"{server.url}/v1/chat/completions", timeout=120,
                                      json={"messages": QUESTION, "temperature": 0, "max_tokens": 16})
                results.append(response.status_code)
            except httpx.HTTPError as error:
                results.append(repr(error))

        clients = [threading.Thread(target=ask) for _ in range(24)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(180)
        gc.collect()
        return results

    resident = []
    for _ in range(3):
        results = load()
        assert len(results) == 24 and set(results) <= {200, 429} and 200 in results, results
        resident.append(psutil.Process().memory_info().rss)
    assert resident[2] - resident[0] < 32 * 2**20, [r / 2**20 for r in resident]
    assert server.state.turns.waiting == 0 and not engine._busy.locked()
    again = server.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=24)
    assert [t["id"] for t in again.choices[0].model_extra["provenance"]] == plain_ids(
        engine, chat_prompt_ids(engine.target.tokenizer, QUESTION))


def test_only_loopback_serves_without_a_key():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")


def test_serving_beyond_loopback_without_a_key_is_refused_with_the_reason(capsys, monkeypatch):
    from app.cli import main

    monkeypatch.delenv("SPECCHAT_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    assert "API key" in capsys.readouterr().err


def test_sampled_requests_run_with_their_seed(engine, serve):
    server = serve(engine)
    ask = lambda seed: server.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=0.9,
                                                              max_tokens=16, seed=seed).choices[0].message.content
    assert ask(3) == ask(3)
