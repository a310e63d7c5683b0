"""A prompt whose caches would not fit the memory left is refused before they grow, with the same
kind of message as a prompt longer than the context, in a process whose address space is limited
(RLIMIT_AS) as a container's or a small machine's would be."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LIMITED = textwrap.dedent("""
    import resource, threading
    import psutil
    from app.engine.engine import SpeculativeEngine
    from app.engine.errors import PromptTooLongError
    from tests.helpers import options
    from tests.tiny import tiny_model

    engine = SpeculativeEngine(tiny_model(seed=1, context=50_000_000), tiny_model(seed=2, context=50_000_000))
    list(engine.generate([5, 6, 7], options(k=2, max_new_tokens=4)))  # a short prompt still answers
    room = 400 << 20
    used = psutil.Process().memory_info().vms
    resource.setrlimit(resource.RLIMIT_AS, (used + room, used + room))
    per_token = engine._target.bytes_per_token + engine._draft.bytes_per_token
    prompt = [5] * (2 * room // per_token)  # caches of twice the room left
    print("read ahead:", engine.read_ahead(prompt, threading.Event()))
    try:
        list(engine.generate(prompt, options(k=2, max_new_tokens=4)))
        print("answered")
    except PromptTooLongError as error:
        print("refused:", error)
    print("after:", len(list(engine.generate([5, 6, 7], options(k=2, max_new_tokens=4)))) > 0)
""")


def test_a_prompt_too_long_for_the_memory_left_is_refused_before_its_caches_grow():
    run = subprocess.run([sys.executable, "-c", LIMITED], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = run.stdout.splitlines()
    assert lines[:1] == ["read ahead: 0"], run.stdout + run.stderr[-2000:]
    assert lines[1].startswith("refused: The prompt and the answer's room") and "GiB are free now" in lines[1], lines
    assert lines[2] == "after: True"  # the engine goes on answering what fits
