"""Finding and fetching models: the real huggingface_hub client against a stand-in hub on loopback
(tests/hub_standin.py), through the engine's hub modules and `python -m app models`."""
import os
import threading

import pytest

from app.cli import main
from app.engine import memory_check
from app.engine.hub import catalog, fetch, local
from app.engine.hub.access import HubError
from tests.hub_standin import COMMIT, Hub, Repo

BIG = os.urandom(3 << 20)  # a 3 MB "GGUF": the fetch never reads what it fetches


@pytest.fixture
def hub(tmp_path, monkeypatch):
    from tests.test_lowbit import write_tiny_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2")
    stand_in = Hub({
        "tiny/Tiny-GGUF": Repo({"tiny-Q8_0.gguf": (tmp_path / "tiny.gguf").read_bytes(), "big-Q4_K_M.gguf": BIG,
                                "mmproj-tiny-F16.gguf": b"projector", "README.md": b"# tiny"}),
        "tiny/Tiny-Folder": Repo({"config.json": b'{"model_type": "qwen2"}', "model.safetensors": b"\0" * 4096,
                                  "tokenizer.json": b"{}"}),
        "tiny/Tiny-Bert": Repo({"config.json": b"{}", "model.safetensors": b"\0" * 64}, model_type="bert"),
        "tiny/Tiny-Notes": Repo({"README.md": b"# nothing to run"}),
        "tiny/Tiny-Gated": Repo({"tiny-Q8_0.gguf": b"gated bytes"}, gated=True),
    })
    monkeypatch.setenv("HF_ENDPOINT", stand_in.start())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    yield stand_in
    stand_in.stop()


def test_a_search_lists_what_can_run_with_sizes_quantisations_and_fit(hub):
    repos = catalog.search("tiny")
    assert [(r.id, r.gated) for r in repos] == [("tiny/Tiny-GGUF", False), ("tiny/Tiny-Folder", False),
                                                ("tiny/Tiny-Gated", True)]  # no BERT, no repository of notes
    gguf = repos[0]
    assert [(f.name, f.size, f.quantization) for f in gguf.ggufs] == [
        ("tiny-Q8_0.gguf", len(hub.repos["tiny/Tiny-GGUF"].files["tiny-Q8_0.gguf"]), "Q8_0"),
        ("big-Q4_K_M.gguf", len(BIG), "Q4_K_M")]  # the vision projector is no model
    assert repos[1].is_folder_model and repos[1].folder_bytes == 4096 + 2 + len(b'{"model_type": "qwen2"}')
    assert catalog.fit(len(BIG)) is None
    assert "memory" in catalog.fit(memory_check.total_memory())  # a file as large as the machine's memory


def test_a_repository_is_found_by_its_id_or_url(hub):
    for query in ("tiny/Tiny-GGUF", "https://huggingface.co/tiny/Tiny-GGUF/tree/main"):
        assert [r.id for r in catalog.search(query)] == ["tiny/Tiny-GGUF"]


def test_the_search_command_prints_files_sizes_and_fit(hub, capsys):
    assert main(["models", "search", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "tiny/Tiny-GGUF" in out and "big-Q4_K_M.gguf" in out and "3 MB" in out
    assert "Q4_K_M" in out and "fits" in out and "tiny/Tiny-Bert" not in out and "mmproj" not in out


def test_a_pulled_file_is_in_the_standard_hub_cache(hub):
    from huggingface_hub import hf_hub_download

    path = fetch.pull("tiny/Tiny-GGUF", "big-Q4_K_M.gguf")
    assert path.read_bytes() == BIG and path.is_symlink()
    assert path.parent.name == COMMIT and local.is_here("tiny/Tiny-GGUF", "big-Q4_K_M.gguf")
    # huggingface_hub itself finds it there, offline
    assert hf_hub_download("tiny/Tiny-GGUF", "big-Q4_K_M.gguf", cache_dir=os.environ["HF_HUB_CACHE"],
                           local_files_only=True) == str(path)
    assert fetch.pull("tiny/Tiny-GGUF", "big-Q4_K_M.gguf") == path  # a second pull fetches nothing
    assert hub.ranges == []


def test_a_dropped_connection_is_resumed_with_a_ranged_request(hub):
    hub.drop_after["big-Q4_K_M.gguf"] = 1 << 20
    reports = []
    path = fetch.pull("tiny/Tiny-GGUF", "big-Q4_K_M.gguf", reports.append)
    assert path.read_bytes() == BIG and hub.ranges == [f"bytes={1 << 20}-"]
    assert reports[-1].done == reports[-1].total == len(BIG)


def test_a_cancelled_pull_continues_where_it_stopped(hub):
    hub.throttle = 0.01
    cancel = threading.Event()
    def report(progress):
        if progress.done >= 2 << 20:  # the piece in hand is not written: at least one stays
            cancel.set()
    with pytest.raises(fetch.Cancelled):
        fetch.pull("tiny/Tiny-GGUF", "big-Q4_K_M.gguf", report, cancel)
    assert not local.is_here("tiny/Tiny-GGUF", "big-Q4_K_M.gguf")
    kept = local.partial_bytes("tiny/Tiny-GGUF")
    assert kept >= 1 << 20
    hub.throttle = 0.0
    reports = []
    path = fetch.pull("tiny/Tiny-GGUF", "big-Q4_K_M.gguf", reports.append)
    assert path.read_bytes() == BIG and hub.ranges == [f"bytes={kept}-"]
    assert reports[-1].fetched == len(BIG) - kept and local.partial_bytes("tiny/Tiny-GGUF") == 0


def test_a_damaged_download_is_refused_and_deleted(hub):
    hub.damaged.add("big-Q4_K_M.gguf")
    with pytest.raises(HubError, match="arrived damaged"):
        fetch.pull("tiny/Tiny-GGUF", "big-Q4_K_M.gguf")
    assert not local.is_here("tiny/Tiny-GGUF", "big-Q4_K_M.gguf") and local.partial_bytes("tiny/Tiny-GGUF") == 0


def test_the_disk_is_checked_before_the_download_starts(hub, monkeypatch):
    monkeypatch.setattr(memory_check, "disk_free", lambda folder: len(BIG) - 1)
    with pytest.raises(HubError, match="needs .* more disk"):
        fetch.pull("tiny/Tiny-GGUF", "big-Q4_K_M.gguf")
    assert hub.ranges == [] and local.partial_bytes("tiny/Tiny-GGUF") == 0


@pytest.mark.parametrize(("command", "said"), [
    (["models", "pull", "tiny/Tiny-Gated"], "gated"),
    (["models", "pull", "tiny/Nowhere"], "No such repository"),
    (["models", "pull", "tiny/Tiny-GGUF", "missing.gguf"], "No such file"),
    (["models", "pull", "tiny/Tiny-Notes"], "nothing SpecChat can run"),
])
def test_hub_errors_are_said_in_one_line(hub, capsys, command, said):
    assert main(command) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and "Traceback" not in err


def test_without_a_network_a_search_says_so_in_one_line(hub, capsys, monkeypatch):
    hub.stop()
    assert main(["models", "search", "qwen"]) == 2
    err = capsys.readouterr().err
    assert "No connection to the hub" in err and err.count("\n") == 1


def test_pull_list_and_remove_from_the_command_line(hub, capsys):
    assert main(["models", "pull", "tiny/Tiny-GGUF"]) == 0  # several GGUFs: its Q4_K_M
    out = capsys.readouterr().out
    assert "ready:" in out and "big-Q4_K_M.gguf" in out
    assert main(["models", "pull", "tiny/Tiny-Folder"]) == 0  # a folder: its config, weights and tokenizer
    assert local.is_here("tiny/Tiny-Folder", "model.safetensors") and local.is_here("tiny/Tiny-Folder", "tokenizer.json")
    capsys.readouterr()
    assert main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    assert "tiny/Tiny-GGUF" in listed and "big-Q4_K_M.gguf" in listed and "tiny/Tiny-Folder" in listed
    assert main(["models", "rm", "tiny/Tiny-GGUF"]) == 0
    assert "3 MB freed" in capsys.readouterr().out
    assert [m.repo_id for m in local.local_models()] == ["tiny/Tiny-Folder"]
    assert main(["models", "rm", "tiny/Tiny-GGUF"]) == 2  # gone already: said, not a traceback
