"""The API's HTTP surface under generated input, and a soak of mixed traffic: the real server on
loopback over a tiny engine. Every response is a completion or a well-formed OpenAI error, the
server stays up, the engine ends free and the process's memory flat."""
import gc
import json
import random
import threading
import time

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from app.engine.api import GenerationOptions, SpeculativeEngine, Turns
from app.serve.server import ServerState
from tests.running_server import RunningServer
from tests.tiny import tiny_model

ANSWERED = {200}
REFUSED = {400, 401, 403, 404, 405, 413, 415, 429, 503}
QUESTION = [{"role": "user", "content": "t5 t9 t2 t7"}]


@pytest.fixture(scope="module")
def server():
    engine = SpeculativeEngine(tiny_model(seed=2, context=512), tiny_model(seed=2, context=512))
    running = RunningServer(ServerState(lambda: engine, "tiny", GenerationOptions(k=3, max_new_tokens=8),
                                        turns=Turns(4)))
    running.engine = engine
    yield running
    running.stop()


def body_schema(server, path: str) -> dict:
    """The request body's schema as the app's own OpenAPI document publishes it."""
    spec = httpx.get(f"{server.url}/openapi.json").json()
    return spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def check(response: httpx.Response, streamed: bool, completion: bool = True) -> None:
    """A completion (whole, or a stream ending in [DONE]) or an OpenAI error with its status;
    completion False: any JSON answer of another endpoint."""
    assert response.status_code in ANSWERED | REFUSED, (response.status_code, response.text[:500])
    if response.status_code != 200:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
        return
    if not streamed:
        answer = response.json()
        assert not completion or answer["choices"], response.text[:500]
        return
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", response.text[-500:]
    for event in events[:-1]:
        chunk = json.loads(event)
        assert "choices" in chunk or "error" in chunk


def short(body):
    """Generated bodies ask for at most a few tokens: the fuzz is of the surface, not of the engine's speed."""
    if isinstance(body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and body[key] > 4:
                body[key] = 4
    return body


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bodies_generated_from_the_openapi_schema_get_an_answer_or_an_openai_error(server, path):
    schema = body_schema(server, path)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=from_schema(schema).map(short))
    def ask(body):
        response = httpx.post(f"{server.url}{path}", json=body, timeout=60)
        check(response, streamed=response.headers.get("content-type", "").startswith("text/event-stream"))

    ask()
    assert httpx.get(f"{server.url}/health").status_code == 200


junk = st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                 st.builds(lambda value: json.dumps(value).encode(), st.recursive(
                     st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                     max_leaves=12)))
# what a client can send as a header value: no spaces at either end (h11 refuses those before sending)
header_value = st.from_regex(r"[!-~]([ -~]{0,38}[!-~])?", fullmatch=True)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(content=junk, content_type=st.sampled_from(["application/json", "text/plain", "application/json; charset=utf-8",
                                                   "", "application/x-www-form-urlencoded", "application/JSON"]),
       origin=st.none() | header_value,
       host=st.none() | st.sampled_from(["localhost", "127.0.0.1:1", "[::1]", "app.localhost:80", "evil.example",
                                         "192.168.0.2"]) | st.from_regex(r"[a-z0-9.-]{1,20}(:[0-9]{1,5})?", fullmatch=True),
       path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/models", "/health", "/x"]),
       method=st.sampled_from(["POST", "GET", "OPTIONS", "PUT"]))
def test_any_bytes_headers_and_methods_get_a_well_formed_answer(server, content, content_type, origin, host, path,
                                                                method):
    headers = {"content-type": content_type} if content_type else {}
    if origin is not None:
        headers["origin"] = origin
    if host is not None:
        headers["host"] = host
    response = httpx.request(method, f"{server.url}{path}", content=content, headers=headers, timeout=60)
    if method == "OPTIONS" and response.status_code in (204, 405):
        return  # a preflight's answer, or none for a path without it
    check(response, streamed=False, completion=path.startswith("/v1/") and "completions" in path)
    if origin is not None and response.status_code != 403:
        raise AssertionError(f"a web page's request was let through: {origin!r} -> {response.status_code}")


def test_a_soak_of_mixed_requests_ends_with_the_engine_free_and_memory_flat(server):
    """Three rounds of 80 requests from 8 clients at once, bounded in count and time: whole and
    streamed answers, streams left early, clients that time out, bad bodies and a full queue
    (429). The engine ends free, the queue empty, and the third round holds no more memory
    than the first."""
    url = f"{server.url}/v1/chat/completions"
    outcomes: list = []

    def one(kind: str) -> None:
        try:
            if kind == "whole":
                outcomes.append(httpx.post(url, json={"messages": QUESTION, "max_tokens": 6}, timeout=60).status_code)
            elif kind == "stream":
                with httpx.stream("POST", url, json={"messages": QUESTION, "max_tokens": 6, "stream": True},
                                  timeout=60) as response:
                    outcomes.append(response.status_code)
                    response.read()
            elif kind == "leave":
                with httpx.stream("POST", url, json={"messages": QUESTION, "max_tokens": 400, "stream": True},
                                  timeout=60) as response:
                    outcomes.append(response.status_code)
                    lines = response.iter_lines()
                    next(lines, None)  # then the client goes
            elif kind == "timeout":
                try:
                    httpx.post(url, json={"messages": QUESTION, "max_tokens": 400}, timeout=0.2)
                except httpx.TimeoutException:
                    pass
                outcomes.append("left")
            else:
                outcomes.append(httpx.post(url, content=b"{not json", headers={"content-type": "application/json"},
                                           timeout=60).status_code)
        except httpx.HTTPError as error:
            outcomes.append(repr(error))

    def round_of(count: int) -> None:
        kinds = random.Random(count).choices(["whole", "stream", "leave", "timeout", "bad"], k=count)
        deadline = time.monotonic() + 120
        for start in range(0, count, 8):
            clients = [threading.Thread(target=one, args=(kind,)) for kind in kinds[start:start + 8]]
            for client in clients:
                client.start()
            for client in clients:
                client.join(max(deadline - time.monotonic(), 1))

    resident = []
    for _ in range(3):
        outcomes.clear()
        round_of(80)
        assert len(outcomes) == 80 and set(outcomes) <= {200, 400, 429, "left"}, outcomes
        deadline = time.monotonic() + 30
        while server.state.turns.busy or server.state.turns.waiting or server.engine._busy.locked():
            assert time.monotonic() < deadline, "the engine was not freed"
            time.sleep(0.05)
        gc.collect()
        resident.append(psutil.Process().memory_info().rss)
    assert not server.state.answers
    assert resident[2] - resident[0] < 32 * 2**20, [r / 2**20 for r in resident]
    assert httpx.post(url, json={"messages": QUESTION, "max_tokens": 2}, timeout=60).status_code == 200
