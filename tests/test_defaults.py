"""Every entry point starts from the same generation defaults."""
from dataclasses import replace

import pytest
import torch

from app.cli import build_parser
from app.engine.models import lean_decoder
from app.engine.engine import GenerationOptions
from app.engine.choices import default_draft_precision
from app.engine.api import CHAT_DEFAULTS, DEFAULTS, LOAD_DEFAULTS
from app.engine.flags import chat_options, generation_options, load_options


def parsed(*argv: str):
    return build_parser().parse_args(list(argv))


def test_defaults_are_the_adaptive_engine_the_readme_measures():
    # The figures in the README come from adaptive k starting at 8, a low-bit target and, with the
    # AVX-512 kernel, a draft whose feed-forward layers are 3-bit (the rest 4-bit).
    assert DEFAULTS == GenerationOptions()
    assert (DEFAULTS.k, DEFAULTS.adaptive, DEFAULTS.speculative) == (8, True, True)
    assert LOAD_DEFAULTS.precision.value == "lowbit"
    assert LOAD_DEFAULTS.draft_precision == default_draft_precision()
    # as llama.cpp's default cache, and the same default whether an engine is given the option or not
    assert LOAD_DEFAULTS.kv_cache_dtype == lean_decoder.NATIVE_CACHE_DTYPE == torch.float16


@pytest.mark.parametrize("isa, precision", [("avx512", "3bit"), ("avx2", "4bit"), ("avxvnni", "4bit"), (None, "4bit")])
def test_the_draft_is_3_bit_only_where_the_kernel_gains_from_it(monkeypatch, isa, precision):
    from app.engine import choices

    monkeypatch.setattr(choices, "machine_isa", lambda: isa)
    assert choices.default_draft_precision().value == precision


def test_terminal_chat_and_benchmarks_parse_to_the_defaults():
    for argv in (["bench", "speed"], ["bench", "seed"]):
        args = parsed(*argv)
        assert generation_options(args) == DEFAULTS, argv  # decoding as llama.cpp's tools do: no repeat penalty
        assert load_options(args) == LOAD_DEFAULTS, argv
    assert chat_options(parsed("chat")) == CHAT_DEFAULTS  # the window's, too (below)
    assert load_options(parsed("chat")) == LOAD_DEFAULTS
    assert CHAT_DEFAULTS == replace(DEFAULTS, sampling=replace(DEFAULTS.sampling, repeat_penalty=1.1))


def test_the_chats_repeat_penalty_flags_reach_the_options_and_bad_values_stop_before_the_models_load(capsys):
    sampling = chat_options(parsed("chat", "--repeat-penalty", "1.3", "--repeat-last-n", "16")).sampling
    assert (sampling.repeat_penalty, sampling.repeat_last_n) == (1.3, 16)
    from app.cli import main

    for argv in (["chat", "--repeat-penalty", "0"], ["chat", "--top-p", "3"], ["bench", "speed", "--top-p", "3"]):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
    assert "top_p must be in (0, 1], got 3.0" in capsys.readouterr().err


def test_window_controls_start_from_the_defaults(qtbot):
    from app.ui.controls import ControlsPanel

    panel = ControlsPanel("CPU")
    qtbot.addWidget(panel)
    assert panel.generation_options() == CHAT_DEFAULTS
    assert panel.load_options() == LOAD_DEFAULTS


def test_flags_change_what_they_name():
    args = parsed("bench", "speed", "-k", "3", "--no-adaptive", "--proposer", "lookup", "--temperature", "0.7")
    options = generation_options(args)
    assert (options.k, options.adaptive, options.proposer.value, options.sampling.temperature) == (3, False, "lookup", 0.7)


def test_the_kv_cache_flag_reaches_the_engines_caches():
    """`--kv-cache float32` gives the low-bit models' native caches float32 keys and values; the
    default is float16."""
    from app.engine.engine import SpeculativeEngine
    from app.engine.lowbit import kernel
    from app.engine.lowbit.modules import quantize_model
    from app.engine.models.loading import LoadedModel
    from tests.tiny import tiny_model

    assert load_options(parsed("chat", "--kv-cache", "float32")).kv_cache_dtype == torch.float32
    assert load_options(parsed("bench", "seed")).kv_cache_dtype == torch.float16
    if kernel.native() is None:
        pytest.skip("the C++ kernel is not built on this machine: the Python loop's cache is float32")
    tiny = tiny_model(seed=3, hidden=64)
    model = LoadedModel("tiny", quantize_model(tiny.model, 4), tiny.tokenizer)
    for flag, dtype in (("float16", torch.float16), ("float32", torch.float32)):
        engine = SpeculativeEngine(model, model, 0, load_options(parsed("chat", "--kv-cache", flag)).kv_cache_dtype)
        for decoder in (engine._target, engine._draft):
            assert isinstance(decoder, lean_decoder.LeanDecoder)
            decoder.feed(torch.tensor([1, 2, 3]))
            assert decoder.keys[0].dtype == decoder.values[0].dtype == dtype


def test_the_terminal_chat_continues_an_answer_cut_short(tiny_target, tiny_draft, monkeypatch, capsys):
    """`/continue` goes on with an answer its length limit cut: under greedy decoding the two
    parts print what twice the budget prints at once; with nothing cut short it says so."""
    from app import terminal

    # the tiny models as loaded (their tokenizer does not survive a round trip through a folder)
    monkeypatch.setattr("app.engine.models.loading.load_model", lambda source, *args, **kwargs: {"t": tiny_target, "d": tiny_draft}[source])

    def chat(lines: list[str], budget: int) -> tuple[str, str]:
        typed = iter(lines)
        monkeypatch.setattr("builtins.input", lambda prompt="": next(typed))
        args = parsed("chat", "--target", "t", "--draft", "d", "--max-new-tokens", str(budget))
        assert terminal.run_terminal_chat(args) == 0
        captured = capsys.readouterr()
        return captured.out, captured.err

    whole, _ = chat(["t5 t9 t2", ""], 16)
    parts, log = chat(["t5 t9 t2", "/continue", ""], 8)
    assert "cut short" in log and log.count(" tokens, ") == 2  # the first part stopped at its limit
    assert parts == whole and len(whole.split()) > 8
    _, log = chat(["/continue", ""], 8)
    assert "nothing to continue" in log


def test_the_terminal_chat_runs_a_target_of_another_family_alone(tiny_target, monkeypatch, capsys):
    """A draft whose vocabulary the target does not share: said in a line, and the target answers
    alone (by prompt lookup: its own greedy output) instead of the chat ending."""
    from app import terminal
    from tests.tiny import tiny_model

    foreign = tiny_model(seed=3, vocab_size=64, prefix="w")
    monkeypatch.setattr("app.engine.models.loading.load_model", lambda source, *args, **kwargs: {"t": tiny_target, "f": foreign}[source])
    outputs = []
    for speculative in ("--speculative", "--no-speculative"):
        typed = iter(["t5 t9 t2", ""])
        monkeypatch.setattr("builtins.input", lambda prompt="": next(typed))
        args = parsed("chat", "--target", "t", "--draft", "f", "--max-new-tokens", "12", speculative)
        assert terminal.run_terminal_chat(args) == 0
        captured = capsys.readouterr()
        assert "do not share a vocabulary" in captured.err and "runs alone" in captured.err
        outputs.append(captured.out)
    assert outputs[0] == outputs[1] and outputs[0].strip()


def test_the_terminal_chat_shows_control_characters_instead_of_obeying_them():
    """An answer holding ESC [2J would clear the user's terminal, a BEL ring it, ESC ]0; retitle it."""
    from app.terminal import printable

    assert printable("a\x1b[2Jb\x07\x9b\x1b]0;owned\x07 x\n\ty") == "a\\x1b[2Jb\\x07\\x9b\\x1b]0;owned\\x07 x\n\ty"
    assert printable("naïve → ok") == "naïve → ok"


@pytest.mark.parametrize("bench", ["speed", "seed"])
def test_the_benchmarks_report_a_bad_model_file_in_a_line(bench, tmp_path, capsys):
    """A missing or corrupt GGUF file stops a benchmark with what is wrong with it (exit status 2),
    as the terminal chat does, not with a traceback."""
    from app.cli import main

    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"not a GGUF file")
    (tmp_path / "gsm8k_test.jsonl").write_text('{"question": "What is 2 + 2?", "answer": "#### 4"}\n')
    data = {"speed": ["--data", str(tmp_path / "gsm8k_test.jsonl")], "seed": ["--data-dir", str(tmp_path), "--tasks", "gsm8k"]}
    for path, reason in ((tmp_path / "missing.gguf", "not found"), (corrupt, "not a readable GGUF file")):
        assert main(["bench", bench, "--draft", str(path), "--target", str(path), "--limit", "1", *data[bench]]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and reason in err and str(path) in err
