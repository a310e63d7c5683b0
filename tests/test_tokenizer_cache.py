"""Tokenizers of the same files are read once: a draft and its target share the backend, each
with its own chat template, and the pair check accepts them at once."""
from transformers import AutoTokenizer

from app.engine.models.loading import vocabulary_mismatch
from app.engine.models.shared_tokenizers import folder_tokenizer
from tests.tiny import tiny_tokenizer


def test_folders_of_one_vocabulary_share_it_and_keep_their_chat_templates(tmp_path):
    tokenizer = tiny_tokenizer(64)
    for name in ("target", "draft"):
        tokenizer.chat_template = f"{name}: {{{{ messages[0]['content'] }}}}"
        tokenizer.save_pretrained(tmp_path / name)
    target, draft = folder_tokenizer(tmp_path / "target"), folder_tokenizer(tmp_path / "draft")
    assert draft.backend_tokenizer is target.backend_tokenizer
    for name, loaded in (("target", target), ("draft", draft)):
        assert loaded.chat_template == AutoTokenizer.from_pretrained(tmp_path / name).chat_template
        prompt = loaded.apply_chat_template([{"role": "user", "content": "t3 t5"}], tokenize=False)
        assert prompt == f"{name}: t3 t5"
    assert draft("t1 t2 t3").input_ids == target("t1 t2 t3").input_ids == [1, 2, 3]
    assert vocabulary_mismatch(draft, target) is None


def test_different_vocabularies_are_read_apart_and_refused(tmp_path):
    tiny_tokenizer(64).save_pretrained(tmp_path / "target")
    tiny_tokenizer(64, prefix="w").save_pretrained(tmp_path / "draft")
    target, draft = folder_tokenizer(tmp_path / "target"), folder_tokenizer(tmp_path / "draft")
    assert draft.backend_tokenizer is not target.backend_tokenizer
    assert "same size, different tokens" in vocabulary_mismatch(draft, target)
