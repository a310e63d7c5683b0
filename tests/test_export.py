"""python -m app export-hf: a model the app loads, written as a Hugging Face folder for vLLM."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.cli import main
from app.engine.api import ModelError, load_tokenizer
from app.engine.models.export import export_hf


def test_a_model_folder_is_written_in_bfloat16_with_its_tokenizer(tiny_target, tmp_path):
    tiny_target.model.save_pretrained(tmp_path / "m")
    tiny_target.tokenizer.save_pretrained(tmp_path / "m")
    assert main(["export-hf", str(tmp_path / "m"), str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert exported.dtype == torch.bfloat16
    for name, weight in tiny_target.model.state_dict().items():
        assert torch.equal(exported.state_dict()[name], weight.to(torch.bfloat16)), name
    # the tokenizer the app reads from the model: the prompts it builds are the ones the server reads
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").get_vocab() == load_tokenizer(str(tmp_path / "m")).get_vocab()
    assert not (tmp_path / "hf.partial").exists()


def test_an_existing_folder_or_a_missing_model_is_refused(tiny_target, tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    with pytest.raises(ModelError, match="exists already"):
        export_hf("default-target", tmp_path / "taken")
    assert main(["export-hf", str(tmp_path / "nowhere.gguf"), str(tmp_path / "hf")]) == 2
    assert "GGUF file not found" in capsys.readouterr().err and not (tmp_path / "hf").exists()
