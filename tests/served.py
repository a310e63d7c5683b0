"""A real vLLM server for the remote-target tests: a tiny random Qwen2 target (head_dim 128, as
vLLM's CPU attention needs) and a draft that is its first layer (the same embeddings, first
layer and head), so the server's own speculation accepts a fair share of its drafts.

vLLM lives in a virtual environment of its own (it pins another transformers); the tests find
its Python in SPECCHAT_VLLM_PYTHON.
"""
from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

VLLM_PYTHON = os.environ.get("SPECCHAT_VLLM_PYTHON")
START_SECONDS = 420  # about 90 s on a 2-core machine; more when the machine is busy with other tests
SPEC_TOKENS = 3


def build_pair(folder: Path) -> tuple[Path, Path]:
    """(target folder, draft folder): safetensors, a byte-level BPE tokenizer that both
    transformers versions read alike, and a chat template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # a fixed text (English, code, Markdown): the tiny pair's outputs stay put whatever the docs say
    text = (Path(__file__).parent / "bpe_corpus.txt").read_text(encoding="utf-8")
    backend.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=510, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"],
        show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")
    tokenizer.chat_template = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                         initializer_range=0.2, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        target = Qwen2ForCausalLM(config).eval()
        for weight in (target.model.layers[1].self_attn.o_proj.weight, target.model.layers[1].mlp.down_proj.weight):
            weight.data *= 0.25  # the second layer nudges the first one's output: the draft is often right
    draft = Qwen2ForCausalLM(Qwen2Config(**{**config.to_dict(), "num_hidden_layers": 1, "layer_types": None})).eval()
    draft.load_state_dict({name: value for name, value in target.state_dict().items() if ".layers.1." not in name})
    paths = folder / "target", folder / "draft"
    for model, path in zip((target, draft), paths):
        model.generation_config.eos_token_id = None  # answers run to their length limit
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return paths


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_vllm(target: Path, draft: Path | None, port: int, log: Path, name: str = "tiny") -> subprocess.Popen:
    """vLLM's OpenAI server on CPU, started as its README for CPUs says; drafting with `draft`."""
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    command = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
               "--served-model-name", name, "--dtype", "bfloat16", "--max-model-len", "2048", "--block-size", "32",
               "--host", "127.0.0.1", "--port", str(port)]
    if draft is not None:
        command += ["--speculative-config",
                    f'{{"method":"draft_model","model":"{draft}","num_speculative_tokens":{SPEC_TOKENS}}}',
                    "--per-request-spec-decode-metrics", "detailed"]
    with open(log, "wb") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_until_ready(server: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vLLM ended with code {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError(f"vLLM did not start in {START_SECONDS} s:\n{log.read_text()[-3000:]}")


def answer_steps(remote, prompt_ids: list[int], options, stop_after: int | None = None) -> list:
    """A served answer's steps, asked on a thread of its own as the app asks them (a blocking call
    never runs where an asyncio loop runs: the GUI tests leave qasync's on this one); Stop once
    `stop_after` steps came."""
    def run() -> list:
        cancel, steps = threading.Event(), []
        for step in remote.generate(prompt_ids, options, cancel):
            steps.append(step)
            if len(steps) == stop_after:
                cancel.set()
        return steps

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()
