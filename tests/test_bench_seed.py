"""bench seed: standard scoring, and an end-to-end run with resume on tiny models."""
import json

import pytest

from app.bench import seed as seed_module
from app.bench.tasks import TASKS, cnndm_score, gsm8k_score, mmlu_letter, mmlu_score
from app.cli import build_parser
from app.engine.engine import SpeculativeEngine
from tests.tiny import tiny_model


def test_gsm8k_takes_the_last_number():
    row = {"answer": "... so 18 eggs.\n#### 1,018"}
    assert gsm8k_score("We get 3 then 1018.", row) == {"correct": 1.0}
    assert gsm8k_score("The answer is 1,018", row) == {"correct": 1.0}
    assert gsm8k_score("1018 is wrong, it is 17", row) == {"correct": 0.0}
    assert gsm8k_score("no number", row) == {"correct": 0.0}


@pytest.mark.parametrize("output, letter", [
    ("B. Because ...", "B"), ("The correct answer is (C).", "C"), ("Answer is d", "D"),
    ("A good question. The answer is B", "B"), ("I think it's C here", "C"), ("none", None),
])
def test_mmlu_letter(output, letter):
    assert mmlu_letter(output) == letter


def test_mmlu_and_rouge_scores():
    assert mmlu_score("B. yes", {"answer": 1}) == {"correct": 1.0}
    scores = cnndm_score("the cat sat on the mat", {"highlights": "a cat sat on a mat"})
    assert set(scores) == {"rouge1", "rouge2", "rougeL"} and 0.6 < scores["rouge1"] < 0.7


def test_mmlu_rows_spread_over_subjects(tmp_path):
    lines = [json.dumps({"question": "q", "subject": f"s{i // 10}", "choices": list("wxyz"), "answer": 0})
             for i in range(100)]
    (tmp_path / "mmlu_test.jsonl").write_text("\n".join(lines))
    assert [r["subject"] for r in TASKS["mmlu"].rows(tmp_path, 5)] == ["s0", "s2", "s4", "s6", "s8"]


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    rows = {
        "gsm8k_test.jsonl": [{"question": f"t{i} t2 t3", "answer": "#### 4"} for i in range(3)],
        "mmlu_test.jsonl": [{"question": "t5", "subject": "x", "choices": ["a", "b", "c", "d"], "answer": 1}] * 3,
        "cnndm_test80.jsonl": [{"question_id": i, "article": f"t{i} t9 t8 t7", "highlights": "t9 t8"} for i in range(3)],
    }
    for name, items in rows.items():
        (folder / name).write_text("\n".join(json.dumps(r) for r in items))
    return folder


def test_seed_run_scores_times_and_resumes(tmp_path, data_dir, monkeypatch):
    engine = SpeculativeEngine(tiny_model(seed=1), tiny_model(seed=2))
    calls = []
    original = seed_module.run_item
    monkeypatch.setattr(seed_module, "run_item", lambda *a: calls.append(a[1].name) or original(*a))
    out = tmp_path / "seed.json"
    argv = ["bench", "seed", "--data-dir", str(data_dir), "--max-new-tokens", "12", "--json", str(out),
            "--resume", str(tmp_path / "resume.jsonl")]
    first = seed_module.run_seed(build_parser().parse_args(argv + ["--limit", "1"]), engine)
    assert len(calls) == 3
    # "killed" after the first item of each task: a second run reuses them and adds the rest
    result = seed_module.run_seed(build_parser().parse_args(argv + ["--limit", "2"]), engine)
    assert len(calls) == 6
    assert result["identical"] and set(result["tasks"]) == {"gsm8k", "mmlu", "cnndm"}
    for summary in result["tasks"].values():
        assert summary["items"] == 2 and summary["speedup"] > 0 and summary["identical"]
        # decoding's own rate leaves the prompt's reading out, so it is the higher one
        for mode in ("plain", "speculative"):
            assert summary[f"{mode}_decode_tokens_per_s"] > summary[f"{mode}_tokens_per_s"]
        assert summary["decode_speedup"] == pytest.approx(
            summary["speculative_decode_tokens_per_s"] / summary["plain_decode_tokens_per_s"], rel=1e-2)
        assert summary["quality_plain"] == summary["quality_speculative"]
    assert set(result["tasks"]["cnndm"]["quality_plain"]) == {"rouge1", "rouge2", "rougeL"}
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "| gsm8k | 2 |" in out.with_suffix(".md").read_text()
    assert first["tasks"]["gsm8k"]["items"] == 1


def test_records_resumed_from_before_prefill_was_timed_give_no_decode_rates():
    timed = {"tokens": 10, "seconds": 2.0, "prefill_seconds": 1.0, "drafted": 4, "accepted": 2, "target_passes": 5,
             "score": {"correct": 1.0}}
    old = {key: value for key, value in timed.items() if key != "prefill_seconds"}
    fresh = seed_module.summarize([{"plain": timed, "speculative": timed, "identical": True}])
    assert fresh["plain_decode_tokens_per_s"] == 10.0 and fresh["decode_speedup"] == 1.0
    mixed = seed_module.summarize([{"plain": timed, "speculative": timed, "identical": True},
                                   {"plain": old, "speculative": old, "identical": True}])
    assert "decode_speedup" not in mixed and "plain_decode_tokens_per_s" not in mixed and mixed["speedup"] == 1.0
    assert "| – |" in seed_module.markdown_table({"gsm8k": mixed})


def test_seed_run_compares_with_a_reference_run(tmp_path, data_dir):
    """Two runs on the same items: one with the same target (agrees everywhere), one with
    another target (agrees nowhere on greedy text)."""
    argv = lambda name, *extra: ["bench", "seed", "--data-dir", str(data_dir), "--max-new-tokens", "10", "--limit", "2",
                                 "--json", str(tmp_path / f"{name}.json"), "--resume", str(tmp_path / f"{name}.jsonl"),
                                 *extra]
    draft = tiny_model(seed=2)
    reference = seed_module.run_seed(build_parser().parse_args(argv("reference", "--modes", "speculative")),
                                     SpeculativeEngine(tiny_model(seed=1), draft))
    assert "plain_tokens_per_s" not in reference["tasks"]["gsm8k"]  # a reference needs one greedy run only
    same = seed_module.run_seed(build_parser().parse_args(argv("same", "--reference", str(tmp_path / "reference.jsonl"))),
                                SpeculativeEngine(tiny_model(seed=1), draft))
    other = seed_module.run_seed(build_parser().parse_args(argv("other", "--reference", str(tmp_path / "reference.jsonl"))),
                                 SpeculativeEngine(tiny_model(seed=3), draft))
    for task in ("gsm8k", "mmlu", "cnndm"):
        assert same["reference"]["tasks"][task]["same_text"] == 1.0
        assert same["reference"]["tasks"][task]["quality"] == same["reference"]["tasks"][task]["reference_quality"]
        assert other["reference"]["tasks"][task]["same_text"] < 1.0
    assert "same text" in (tmp_path / "same.md").read_text()


def test_a_peer_that_dies_on_this_cpu_is_left_out_with_the_reason(monkeypatch, tmp_path):
    """llama.cpp's kernels can die on a CPU (llama-cpp-python 0.3.36's AMX kernels: an illegal
    instruction). The peer runs a batch in a child process first, so such a fault leaves it out
    with the reason instead of ending the whole benchmark."""
    from pathlib import Path

    from app.bench import llama_peer

    monkeypatch.setattr(llama_peer, "_SMOKE_TEST", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    reason = llama_peer.crash_reason(tmp_path / "model.gguf", 2)
    assert "SIGILL" in reason and "AMX" in reason and "left out" in reason
    monkeypatch.setattr(llama_peer, "_SMOKE_TEST", "import sys; sys.exit('no such file')")
    assert llama_peer.crash_reason(tmp_path / "model.gguf", 2).startswith(
        "llama.cpp failed to load the files or run a 64-token batch here (no such file)")
    monkeypatch.setattr(llama_peer, "_SMOKE_TEST", "import sys; assert sys.argv[1:] == ['m.gguf', '2', 't.gguf']")
    assert llama_peer.crash_reason(Path("m.gguf"), 2, Path("t.gguf")) is None


def test_the_peers_memory_is_read_from_a_process_of_its_own(monkeypatch):
    """llama.cpp's memory for the table: a child process holding both models (as a user's
    llama.cpp would, without the benchmark's second instance of the target) reports its resident
    size; a child that fails gives no figure rather than ending the benchmark."""
    from pathlib import Path

    from app.bench import llama_peer

    monkeypatch.setattr(llama_peer, "_MEMORY", "import sys; assert sys.argv[1:] == ['2', '4096', 't.gguf', 'd.gguf']; print(123)")
    assert llama_peer.memory_bytes(Path("t.gguf"), Path("d.gguf"), 2) == 123
    monkeypatch.setattr(llama_peer, "_MEMORY", "import sys; sys.exit('cannot load')")
    assert llama_peer.memory_bytes(Path("t.gguf"), Path("d.gguf"), 2) is None
