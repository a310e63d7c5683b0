"""The target on a server, through the same client the window uses: here the server is another
SpecChat (our API, real, on tiny models), which speaks vLLM's dialect; the tests against a real
vLLM are in test_vllm_remote_target.py."""
import time

import pytest

from app.chat.prompt import chat_prompt_ids
from app.engine.api import FinishReason, GenerationOptions, SpeculativeEngine, Source, Turns
from app.engine.remote.client import ServerError
from app.engine.remote.engine import RemoteEngine
from app.serve.server import ServerState
from tests.running_server import RunningServer
from tests.served import answer_steps, free_port
from tests.tiny import tiny_model, tiny_tokenizer

QUESTION = [{"role": "user", "content": "t5 t9 t2 t7"}]


@pytest.fixture(scope="module")
def engine():
    return SpeculativeEngine(tiny_model(seed=1, context=4096), tiny_model(seed=1, context=4096))


@pytest.fixture
def server(engine):
    options = GenerationOptions(k=3, adaptive=False, max_new_tokens=24)
    running = RunningServer(ServerState(lambda: engine, "tiny", options, turns=Turns(4)))
    yield running
    running.stop()


def plain_ids(engine, prompt_ids, max_new_tokens):
    assert engine._busy.acquire(timeout=10)  # the server's last answer has let go of it
    engine._busy.release()
    options = GenerationOptions(speculative=False, max_new_tokens=max_new_tokens)
    return [token.id for step in engine.generate(prompt_ids, options) for token in step.tokens]


def test_two_specchats_greedy_tokens_and_colours_are_the_servers(engine, server):
    remote = RemoteEngine.connect(server.url + "/v1", "tiny", engine.target.tokenizer)
    assert remote.target.context_length == 4096 and remote.speculation.spec_tokens == 3
    prompt = chat_prompt_ids(engine.target.tokenizer, QUESTION)
    steps = answer_steps(remote, prompt, GenerationOptions(max_new_tokens=40))
    ids = [token.id for step in steps for token in step.tokens]
    assert ids == plain_ids(engine, prompt, 40)
    sources = [token.source for step in steps for token in step.tokens]
    stats = steps[-1].stats
    assert steps[-1].finish is FinishReason.LENGTH and steps[-1].relabelled is None
    assert Source.ACCEPTED in sources and stats.accepted == sources.count(Source.ACCEPTED)
    # the server's account is every token's: each step that drafted ends in a corrected or bonus token
    assert sum(stats.accepted_lengths) == stats.accepted
    assert len(stats.drafted_lengths) == sum(source in (Source.CORRECTED, Source.BONUS) for source in sources)
    assert not steps[-1].estimated
    assert stats.first_token_seconds is not None and stats.emitted == 40


def test_connecting_says_what_is_wrong(engine, server):
    tokenizer = engine.target.tokenizer
    with pytest.raises(ServerError, match="serves no model named 'other'; it serves: tiny"):
        RemoteEngine.connect(server.url, "other", tokenizer)
    with pytest.raises(ServerError, match="cannot reach a server at http://127.0.0.1:"):
        RemoteEngine.connect(f"127.0.0.1:{free_port()}", None, tokenizer)
    with pytest.raises(ServerError, match="HTTP 404"):
        RemoteEngine.connect(server.url + "/somewhere/else", None, tokenizer)
    with pytest.raises(ServerError, match=r"tokenizer for 'tiny' differs from mine's: at token 12 of a probe text "
                       r"the server has id 0, mine id 1 \('w1'\)"):
        RemoteEngine.connect(server.url, None, tiny_tokenizer(96, prefix="w"), tokenizer_name="mine")


def test_stop_ends_the_request_on_the_server(engine, server):
    remote = RemoteEngine.connect(server.url, None, engine.target.tokenizer)
    steps = answer_steps(remote, [5, 9, 2, 7], GenerationOptions(max_new_tokens=4000), stop_after=3)
    assert steps[-1].finish is FinishReason.CANCELLED and steps[-1].stats.emitted < 100
    deadline = time.monotonic() + 10
    while server.state.turns.busy:  # the server's turn ends with its engine's thread
        assert time.monotonic() < deadline, "the server went on with the answer"
        time.sleep(0.05)
    assert engine._busy.acquire(timeout=1)
    engine._busy.release()


def test_bench_speed_against_a_speculative_and_a_plain_server(engine, tmp_path):
    """bench speed --server/--plain-server: its table for 1, 4 and 8 concurrent chats."""
    from app.cli import build_parser
    from app.bench.served import run_served_speed

    engine.target.tokenizer.save_pretrained(tmp_path / "m")  # (only the tokenizer: the prompts are built here)
    (tmp_path / "q.jsonl").write_text("".join(f'{{"question": "t{i} t{i + 3} t{i + 5}"}}\n' for i in range(8)))
    servers = [RunningServer(ServerState(lambda: engine, "tiny", GenerationOptions(k=3, adaptive=False, speculative=s),
                                         turns=Turns(16))) for s in (True, False)]
    try:
        args = build_parser().parse_args(
            ["bench", "speed", "--server", servers[0].url, "--plain-server", servers[1].url, "--target",
             str(tmp_path / "m"), "--data", str(tmp_path / "q.jsonl"), "--max-new-tokens", "12"])
        result = run_served_speed(args)
    finally:
        for server in servers:
            server.stop()
    assert [(row["mode"], row["chats"]) for row in result["rows"]] == [
        ("speculative", 1), ("speculative", 4), ("speculative", 8), ("plain", 1), ("plain", 4), ("plain", 8)]
    assert all(row["tokens"] == 12 * row["chats"] for row in result["rows"])
    assert result["rows"][0]["acceptance_rate"] > 0.5 and result["rows"][3]["acceptance_rate"] is None
    assert result["greedy_identical"] == {"answers": 13, "identical": 13}  # our engine: exactly the target's
