"""kill -9 at random points while the app writes what it keeps: a first start's prepared copy of
a model, and the caches saved for the next run. The next start works, answers as a fresh one
does, and leaves nothing half-written behind. (A kill during a kernel build: test_kernel_cache;
during a chat's save: test_store.)"""
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from app.engine import files

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "SPECCHAT_NO_NATIVE_KERNEL": "1"}

PREPARE = textwrap.dedent("""
    import sys
    from app.engine.models.loading import load_model
    loaded = load_model(sys.argv[1], precision="4bit")
    print("loaded", loaded.precision, flush=True)
""")


def killed_after(script: str, args: list[str], env: dict, seconds: float) -> subprocess.CompletedProcess | None:
    """Runs `script`, killed with SIGKILL after `seconds` unless it ended first (then its result)."""
    process = subprocess.Popen([sys.executable, "-c", script, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=seconds)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def test_a_first_start_killed_while_preparing_leaves_the_next_one_working(tmp_path):
    from tests.tiny import tiny_model

    folder = tmp_path / "model"
    tiny = tiny_model(seed=1)
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    env = {**ENV, "SPECCHAT_CACHE": str(tmp_path / "cache")}
    # how long an unkilled first start takes here: the kills land anywhere in it
    began = time.monotonic()
    whole = killed_after(PREPARE, [str(folder)], {**env, "SPECCHAT_CACHE": str(tmp_path / "timing")}, 300)
    assert whole is not None and whole.stdout.startswith("loaded"), whole and whole.stderr[-2000:]
    length = time.monotonic() - began
    rng = random.Random(3)
    for _ in range(4):
        killed_after(PREPARE, [str(folder)], env, rng.uniform(0.3, 1.0) * length)
    final = killed_after(PREPARE, [str(folder)], env, 300)
    assert final is not None and final.stdout.startswith("loaded 4bit"), final and final.stderr[-2000:]
    models = tmp_path / "cache" / "models"
    assert not [path for path in models.iterdir() if files.is_partial(path)]
    assert killed_after(PREPARE, [str(folder)], env, 300).stdout.startswith("loaded 4bit")  # from the copy


SAVING = textwrap.dedent("""
    import sys
    from pathlib import Path
    from app.engine.engine import SpeculativeEngine
    from tests.helpers import options
    from tests.tiny import tiny_model
    engine = SpeculativeEngine(tiny_model(seed=1), tiny_model(seed=1, init_range=0.21))
    engine.keep_saved_caches(Path(sys.argv[1]))
    for turn in range(10_000):
        prompt = [(7 * i + turn) % 90 + 1 for i in range(200)]
        list(engine.generate(prompt, options(k=2, max_new_tokens=8)))
        engine.save_caches()
        print("saved", turn, flush=True)
""")

ANSWER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from app.engine.engine import SpeculativeEngine
    from tests.helpers import options
    from tests.tiny import tiny_model
    prompt = [(7 * i) % 90 + 1 for i in range(200)] + [3, 4, 5]
    answers = []
    for folder in (Path(sys.argv[1]), None):  # restored from what the killed run left, then read afresh
        engine = SpeculativeEngine(tiny_model(seed=1), tiny_model(seed=1, init_range=0.21))
        engine.keep_saved_caches(folder)
        answers.append([t.id for step in engine.generate(prompt, options(k=2, max_new_tokens=12)) for t in step.tokens])
        if folder is not None:
            engine.save_caches()
    print("same" if answers[0] == answers[1] else f"differ {answers}")
""")


def test_a_run_killed_while_saving_its_caches_leaves_the_next_one_answering_as_a_fresh_one(tmp_path):
    folder = tmp_path / "saved"
    process = subprocess.Popen([sys.executable, "-c", SAVING, str(folder)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                               text=True)
    saves = 0
    while saves < 3:  # a few whole saves first, then a kill at some moment of the next ones
        line = process.stdout.readline()
        assert line, "the saving run ended early"
        saves += line.startswith("saved")
    time.sleep(random.Random(4).uniform(0.0, 1.5))
    process.send_signal(signal.SIGKILL)
    process.wait()
    run = subprocess.run([sys.executable, "-c", ANSWER, str(folder)], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=300)
    assert run.stdout.strip() == "same", run.stdout + run.stderr[-2000:]
    assert not [path for path in folder.rglob("*") if files.is_partial(path)]
