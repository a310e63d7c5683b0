"""The local API against web pages, clients that leave, repeated seeds, metrics that do not add up,
crashes and freezes: each through the real server (uvicorn on loopback) and real tiny engines,
asked with httpx and the official `openai` client."""
import asyncio
import json
import threading
import time

import httpx
import pytest

from app.chat.prompt import chat_prompt_ids
from app.engine.api import Engine, GenerationOptions, SpeculativeEngine
from app.engine.remote.engine import RemoteEngine
from app.serve.guard import Access
from app.serve.server import ServerState
from tests.running_server import RunningServer
from tests.test_server import QUESTION, engine, plain_ids, serve  # noqa: F401 (the fixtures engine and serve)
from tests.tiny import tiny_model

openai = pytest.importorskip("openai")

LONG = {"messages": QUESTION, "temperature": 0, "max_tokens": 3500}


def post(server, path="/v1/chat/completions", body=None, timeout=60, **kwargs):
    return httpx.post(f"{server.url}{path}", timeout=timeout, **({"json": body} if body is not None else {}), **kwargs)


def error_of(response) -> dict:
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    return error


def wait_until(condition, seconds=20):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)


# ---- web pages ----------------------------------------------------------------------------------
def test_a_body_that_is_not_json_typed_is_refused_with_415(engine, serve):
    """A web page may POST text/plain without a CORS preflight: such a body never reaches the engine."""
    server = serve(engine)
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"content-type": content_type} if content_type else {}
        response = post(server, content=json.dumps(LONG).encode(), headers=headers)
        assert response.status_code == 415 and error_of(response)["code"] == "unsupported_media_type"
    assert server.state.requests_served == 0
    assert post(server, body={"messages": QUESTION, "max_tokens": 2}).status_code == 200


def test_a_foreign_origin_is_refused_and_an_allowed_one_gets_cors_headers(engine, serve):
    server = serve(engine)
    page = {"origin": "https://evil.example"}
    refused = post(server, body=LONG, headers=page)
    assert refused.status_code == 403 and error_of(refused)["code"] == "forbidden_origin"
    assert "access-control-allow-origin" not in refused.headers
    preflight = httpx.options(f"{server.url}/v1/chat/completions", headers={
        **page, "access-control-request-method": "POST", "access-control-request-headers": "content-type"})
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
    assert server.state.requests_served == 0

    server.state.access = Access(allowed_origins=frozenset({"http://localhost:3000"}))
    mine = {"origin": "http://localhost:3000"}
    preflight = httpx.options(f"{server.url}/v1/chat/completions", headers={
        **mine, "access-control-request-method": "POST", "access-control-request-headers": "content-type"})
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    allowed = post(server, body={"messages": QUESTION, "max_tokens": 2}, headers=mine)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert post(server, body=LONG, headers=page).status_code == 403  # still not that one


def test_a_rebound_host_is_refused(engine, serve):
    """DNS rebinding: a page's own name resolving to 127.0.0.1 arrives with that name as Host."""
    server = serve(engine)
    port = server.url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "attacker.test", f"192.168.1.5:{port}"):
        response = post(server, body=LONG, headers={"host": host})
        assert response.status_code == 403 and error_of(response)["code"] == "forbidden_host"
        assert httpx.get(f"{server.url}/v1/models", headers={"host": host}).status_code == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "app.localhost"):
        assert httpx.get(f"{server.url}/v1/models", headers={"host": host}).status_code == 200, host
    assert server.state.requests_served == 0


def test_the_serve_command_refuses_web_pages_and_allows_the_origins_it_is_given(tmp_path):
    """`python -m app serve` as a user starts it, asked while its models load: the guard answers
    at once."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", str(port), "--target",
                               "default-target", "--allow-origin", "http://localhost:3000"],
                              cwd=Path(__file__).parents[1], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "SPECCHAT_API_KEY": ""})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url), seconds=60)
        refused = httpx.post(f"{url}/v1/chat/completions", content=json.dumps(LONG), headers={"content-type": "text/plain"})
        assert refused.status_code == 415
        assert httpx.get(f"{url}/v1/models", headers={"origin": "https://evil.example"}).status_code == 403
        assert httpx.get(f"{url}/v1/models", headers={"host": "evil.example"}).status_code == 403
        allowed = httpx.get(f"{url}/v1/models", headers={"origin": "http://localhost:3000"})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
    finally:
        served.kill()
        served.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/models", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ---- clients that leave -------------------------------------------------------------------------
def test_a_whole_answer_whose_client_leaves_frees_the_engine_within_a_step(engine, serve):
    server = serve(engine, queue=2)
    with pytest.raises(httpx.ReadTimeout):
        post(server, body=LONG, timeout=1.0)  # the client gives up on 3,500 tokens
    answered = post(server, body={"messages": QUESTION, "temperature": 0, "max_tokens": 8})
    assert answered.status_code == 200 and answered.json()["usage"]["completion_tokens"] == 8
    wait_until(lambda: not engine._busy.locked())
    assert server.state.turns.waiting == 0 and not server.state.answers


def hold_turn(server):
    """Takes the engine's turn on the server's loop, as a model load does, until the returned
    function is called: requests then wait for as long as a test needs."""
    loop = server.server_loop
    free = asyncio.Event()
    held = asyncio.run_coroutine_threadsafe(server.state.turns.hold(free.wait), loop)
    wait_until(lambda: server.state.turns.busy)

    def release():
        loop.call_soon_threadsafe(free.set)
        held.result(10)

    return release


def test_a_stream_whose_client_leaves_while_it_waits_gives_its_place_back(engine, serve):
    server = serve(engine, queue=1)
    turns = server.state.turns
    release = hold_turn(server)
    try:
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", f"{server.url}/v1/chat/completions", json={**LONG, "stream": True}) as waiting:
                lines = waiting.iter_lines()  # kept: a closed iterator closes the connection
                next(line for line in lines if line.startswith("data: "))  # its role chunk
                assert turns.waiting == 1
                refused = post(server, body=LONG)  # the one place is taken
                assert refused.status_code == 429
        wait_until(lambda: turns.waiting == 0)  # given back while the turn is still held
        assert turns.busy and not server.state.answers
    finally:
        release()
    assert post(server, body={"messages": QUESTION, "max_tokens": 2}).status_code == 200
    assert server.state.requests_served == 1  # the stream that left never ran


# ---- seeds --------------------------------------------------------------------------------------
def test_sampled_requests_without_a_seed_differ_and_with_one_repeat(engine, serve):
    server = serve(engine)
    ask = lambda **seed: server.client().chat.completions.create(
        model="tiny", messages=QUESTION, temperature=1.0, max_tokens=16, **seed).choices[0].message.content
    assert len({ask() for _ in range(3)}) > 1
    assert ask(seed=7) == ask(seed=7)
    for seed in (-1, 2**64, "x"):
        response = post(server, body={"messages": QUESTION, "seed": seed})
        assert response.status_code == 400 and error_of(response)["param"] == "seed"


# ---- metrics ------------------------------------------------------------------------------------
def test_the_metrics_count_every_drafted_token_with_vllms_meanings(engine, serve):
    """A prompt that repeats itself: the first step already copies tokens from it. The metrics
    count them; steps that drafted nothing are not steps of theirs; num_spec_tokens is the
    configured k."""
    server = serve(engine)
    repeated = [{"role": "user", "content": " ".join(["t5 t9 t2 t7 t3 t8"] * 12)}]
    answer = post(server, body={"messages": repeated, "temperature": 0, "max_tokens": 40}).json()
    provenance = answer["choices"][0]["provenance"]
    metrics = answer["metrics"]["speculative_decoding"]
    accepted = sum(token["source"] == "accepted" for token in provenance)
    assert accepted == metrics["num_accepted_draft_tokens"] == sum(metrics["per_step_accepted"]) > 0
    assert metrics["num_spec_tokens"] == 3  # the fixture's k
    assert 0 not in metrics["per_step_drafted"]
    blocks = sum(token["source"] in ("corrected", "bonus") for token in provenance)
    assert metrics["num_spec_steps"] == len(metrics["per_step_drafted"]) == blocks
    assert sum(metrics["acceptance_histogram"]) == metrics["num_spec_steps"]
    plain_off = post(server, body={"messages": repeated, "temperature": 0, "max_tokens": 8,
                                   "model": "tiny"}).json()["metrics"]["speculative_decoding"]
    assert plain_off["num_draft_tokens"] == sum(plain_off["per_step_drafted"])


def test_usage_counts_the_tokens_returned_when_a_stop_string_cuts_the_answer(engine, serve):
    server = serve(engine)
    full = server.client().completions.create(model="tiny", prompt="t5 t9 t2", temperature=0, max_tokens=24)
    text = full.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 4]
    cut = post(server, "/v1/completions", {"prompt": "t5 t9 t2", "temperature": 0, "max_tokens": 24, "stop": stop,
                                           "return_token_ids": True}).json()
    returned = cut["choices"][0]["token_ids"]
    assert cut["choices"][0]["finish_reason"] == "stop" and len(returned) < 24
    assert cut["usage"]["completion_tokens"] == len(returned) == len(cut["choices"][0]["provenance"])


def test_a_completions_text_prompt_gets_the_tokenizers_bos_as_vllms_does(engine, serve, monkeypatch):
    from tokenizers.processors import TemplateProcessing

    tokenizer = engine.target.tokenizer
    monkeypatch.setattr(tokenizer.backend_tokenizer, "post_processor",
                        TemplateProcessing(single="t1 $A", special_tokens=[("t1", 1)]))
    assert tokenizer("t5 t9").input_ids == [1, 5, 9]
    server = serve(engine)
    given = lambda **extra: post(server, "/v1/completions", {"prompt": "t5 t9", "max_tokens": 1,
                                                             "return_token_ids": True, **extra}).json()
    assert given()["choices"][0]["prompt_token_ids"] == [1, 5, 9]
    assert given(add_special_tokens=False)["choices"][0]["prompt_token_ids"] == [5, 9]


# ---- crashes and freezes ------------------------------------------------------------------------
def test_both_engines_implement_the_declared_interface(engine):
    members = [name for name in dir(Engine) if not name.startswith("_")] + list(Engine.__annotations__)
    server = RunningServer(ServerState(lambda: engine, "tiny", GenerationOptions(k=3, adaptive=False)))
    try:
        remote = RemoteEngine.connect(server.url + "/v1", "tiny", engine.target.tokenizer)
    finally:
        server.stop()
    for implementation in (engine, remote):
        missing = [name for name in members if not hasattr(implementation, name)]
        assert not missing, (type(implementation).__name__, missing)
        assert isinstance(implementation, Engine)
    assert remote.vocabulary_size == engine.vocabulary_size == 96


def test_a_server_over_a_served_target_answers(engine, serve):
    """The window's server when its target runs on another server: an answer, not a 500."""
    behind = serve(engine)
    remote = RemoteEngine.connect(behind.url + "/v1", "tiny", engine.target.tokenizer)
    front = RunningServer(ServerState(lambda: remote, "tiny", GenerationOptions(max_new_tokens=8)))
    try:
        answer = front.client().chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=8)
        assert answer.usage.completion_tokens == 8
        ids = [token["id"] for token in answer.choices[0].model_extra["provenance"]]
        assert ids == plain_ids(engine, chat_prompt_ids(engine.target.tokenizer, QUESTION), 8)
        out_of_range = post(front, "/v1/completions", {"prompt": [5, 200]})
        assert out_of_range.status_code == 400 and error_of(out_of_range)["param"] == "prompt"
    finally:
        front.stop()


def test_every_failure_is_an_openai_error_and_a_failed_stream_ends_with_done(engine, serve, monkeypatch):
    server = serve(engine)

    def broken(*args, **kwargs):
        raise RuntimeError("the kernel fell over")
        yield

    monkeypatch.setattr(engine, "generate", broken)
    whole = post(server, body={"messages": QUESTION})
    assert whole.status_code == 500 and "the kernel fell over" in error_of(whole)["message"]
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={"messages": QUESTION, "stream": True},
                      timeout=30) as streamed:
        events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "the kernel fell over" in json.loads(events[-2])["error"]["message"]
    assert server.state.turns.waiting == 0 and not server.state.turns.busy
    missing = httpx.get(f"{server.url}/v1/nothing")
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
    assert error_of(httpx.get(f"{server.url}/v1/chat/completions")) and \
        httpx.get(f"{server.url}/v1/chat/completions").status_code == 405


def test_health_says_loading_until_the_models_are_there(engine, serve):
    loaded = {}
    server = RunningServer(ServerState(lambda: loaded.get("engine"), "tiny", GenerationOptions(max_new_tokens=4)))
    try:
        loading = httpx.get(f"{server.url}/health")
        assert loading.status_code == 503 and error_of(loading)["code"] == "model_not_ready"
        loaded["engine"] = engine
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert post(server, body={"messages": QUESTION}).status_code == 200
    finally:
        server.stop()
    keyed = serve(engine, key="secret")
    assert httpx.get(f"{keyed.url}/health").status_code == 200  # for a load balancer: no key
    assert httpx.get(f"{keyed.url}/v1/models").status_code == 401


def test_a_model_switch_waits_for_the_running_request_and_the_queued_one_runs_on_the_new_pair(engine):
    """The switch takes its turn as a load does (the window's controller): the request running
    ends on its pair, the one queued behind the switch is answered by the new pair."""
    other = SpeculativeEngine(tiny_model(seed=5, context=4096), tiny_model(seed=5, context=4096))
    current = {"engine": engine}
    server = RunningServer(ServerState(lambda: current["engine"], "tiny", GenerationOptions(k=3, max_new_tokens=16)))
    prompt = chat_prompt_ids(engine.target.tokenizer, QUESTION)
    results = {}
    try:
        first = threading.Thread(target=lambda: results.update(first=post(server, body={**LONG, "max_tokens": 300})))
        first.start()
        wait_until(lambda: server.state.turns.busy)
        loop = server.server_loop

        async def switch():
            async def load():
                assert not engine._busy.locked()  # the running answer ended first
                current["engine"] = other

            await server.state.turns.hold(load)

        switched = asyncio.run_coroutine_threadsafe(switch(), loop)
        wait_until(lambda: server.state.turns.waiting == 1)
        second = post(server, body={"messages": QUESTION, "temperature": 0, "max_tokens": 16}).json()
        switched.result(30)
        first.join(60)
        assert results["first"].json()["usage"]["completion_tokens"] == 300
        ids = [token["id"] for token in second["choices"][0]["provenance"]]
        assert ids == plain_ids(other, prompt, 16) != plain_ids(engine, prompt, 16)
    finally:
        server.stop()


# ---- parameters ---------------------------------------------------------------------------------
def test_unsupported_parameters_are_refused_by_name_and_their_no_op_values_pass(engine, serve):
    server = serve(engine)
    for extra, named in [({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                         ({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"logprobs": True, "top_logprobs": 2}, "logprobs"), ({"logit_bias": {"5": 10}}, "logit_bias"),
                         ({"presence_penalty": 0.5}, "presence_penalty"), ({"frequency_penalty": 1}, "frequency_penalty"),
                         ({"made_up": 1}, "made_up")]:
        response = post(server, body={"messages": QUESTION, **extra})
        error = error_of(response)
        assert response.status_code == 400 and error["code"] == "unsupported_parameter" and named in error["message"]
    with pytest.raises(openai.BadRequestError, match="tools"):
        server.client().chat.completions.create(model="tiny", messages=QUESTION, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {}}}])
    no_ops = {"logprobs": False, "presence_penalty": 0, "frequency_penalty": 0.0, "user": "me", "tools": [],
              "response_format": {"type": "text"}, "metadata": {"a": "b"}}
    assert post(server, body={"messages": QUESTION, "max_tokens": 2, **no_ops}).status_code == 200


def test_a_queue_of_none_serves_one_at_a_time_and_a_full_queue_refuses_before_reading_the_prompt(engine, serve):
    server = serve(engine, queue=0)
    assert post(server, body={"messages": QUESTION, "max_tokens": 2}).status_code == 200
    release = hold_turn(server)
    try:  # too long for the context, but nothing may wait: 429, before any tokenizing
        too_long = [{"role": "user", "content": " ".join(["t5"] * 5000)}]
        refused = post(server, body={"messages": too_long})
        assert refused.status_code == 429 and error_of(refused)["code"] == "queue_full"
    finally:
        release()
    assert post(server, body={"messages": QUESTION, "max_tokens": 2}).status_code == 200


def test_the_key_sent_to_a_remote_server_has_a_name_of_its_own(engine, serve, tmp_path, monkeypatch):
    """SPECCHAT_API_KEY is the key this machine's server requires; SPECCHAT_SERVER_KEY the one sent
    to a server that serves the target."""
    from app.engine.api import LoadOptions, ModelError, ModelPool

    remote = serve(engine, key="remote-secret")
    engine.target.tokenizer.save_pretrained(tmp_path / "tokenizer")
    chosen = LoadOptions(target=str(tmp_path / "tokenizer"), server=remote.url + "/v1")
    monkeypatch.setenv("SPECCHAT_API_KEY", "this-machines-own")
    monkeypatch.delenv("SPECCHAT_SERVER_KEY", raising=False)
    pool = ModelPool()
    with pytest.raises((ModelError, Exception), match="SPECCHAT_SERVER_KEY"):
        pool.engine(pool.request(), chosen, lambda *_: None)
    monkeypatch.setenv("SPECCHAT_SERVER_KEY", "remote-secret")
    connected = pool.engine(pool.request(), chosen, lambda *_: None)
    assert connected.served_by and connected.vocabulary_size == 96


def test_a_prompt_the_tokenizer_refuses_is_said_as_such_on_completions(engine, serve, monkeypatch):
    """Only the chat endpoint has a chat template to blame."""
    server = serve(engine)

    def refuse(*args, **kwargs):
        raise ValueError("no such characters here")

    monkeypatch.setattr(type(engine.target.tokenizer), "__call__", refuse)
    response = post(server, "/v1/completions", {"prompt": "t5 t9"})
    error = error_of(response)
    assert response.status_code == 400 and error["param"] == "prompt"
    assert "could not be tokenized: no such characters here" in error["message"] and "template" not in error["message"]
