"""tools/gpu_check.py's dry run on the CPU: every check of the GPU path runs and passes, and the
table says so. (On a GPU the same script is the check; here it proves the script itself.)"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
CHECKS = ["device", "the tiny pair loaded", "plain decoding, greedy", "greedy, speculative, k=4", "greedy, speculative, adaptive k",
          "greedy, prompt lookup", "sampled, speculative, temperature 0.8",
          "rejection sampling keeps the target's distribution", "a follow-up reuses the cache",
          "another chat, and back", "read-ahead", "saved caches round-trip",
          "a GGUF on this device keeps the CPU's copy", "peak memory"]


def test_the_gpu_check_runs_every_check_on_the_cpu(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--device", "cpu", "--samples", "400",
                          "--json", str(tmp_path / "check.json")], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "check.json").read_text())
    assert result["device"] == "CPU: chosen by SPECCHAT_DEVICE"
    assert [row["check"] for row in result["rows"]] == CHECKS
    assert {row["result"] for row in result["rows"]} == {"ok"}
    details = {row["check"]: row["detail"] for row in result["rows"]}
    assert details["greedy, speculative, k=4"].endswith("identical to plain")
    assert "copies kept: fp32, lowbit" in details["a GGUF on this device keeps the CPU's copy"]
    assert "| rejection sampling keeps the target's distribution | ok | total variation" in run.stdout
