"""The GGUF header parsed once over a plain view of the file: the same fields and tensors as
gguf's own reader; the config and the tensor names transformers would make of the whole file."""
import gguf
import numpy as np
import pytest

from app.engine.lowbit import gguf_file


def write_gguf(path, vocabulary: int = 300) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_token_list([f"token{i}" for i in range(vocabulary - 2)] + ["", "żółw ⚙"])
    writer.add_array("tokenizer.ggml.scores", [float(i) for i in range(vocabulary)])
    writer.add_array("tokenizer.ggml.token_type", [i % 3 for i in range(vocabulary)])
    writer.add_string("tokenizer.chat_template", "{{ messages }}")
    writer.add_tensor("token_embd.weight", np.arange(64 * 32, dtype=np.float32).reshape(64, 32))
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_parse_reads_what_gguf_reads(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    expected, parsed = gguf.GGUFReader(path), gguf_file.parse(path)
    assert list(parsed.fields) == list(expected.fields)
    for name, field in expected.fields.items():
        mine = parsed.fields[name]
        assert (mine.offset, mine.types, mine.data) == (field.offset, field.types, field.data), name
        assert len(mine.parts) == len(field.parts), name
        for a, b in zip(field.parts, mine.parts):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
        assert mine.contents() == field.contents(), name
    assert [t.name for t in parsed.tensors] == ["token_embd.weight", "output_norm.weight"]
    for a, b in zip(expected.tensors, parsed.tensors):
        assert a.tensor_type == b.tensor_type and np.array_equal(a.data, b.data)
    assert parsed.fields["tokenizer.ggml.tokens"].contents()[297:] == ["token297", "", "żółw ⚙"]
    assert parsed.fields["tokenizer.ggml.token_type"].contents()[:4] == [0, 1, 2, 0]


def test_parse_reads_over_a_plain_array_not_a_memmap(tmp_path):
    """np.memmap's Python hooks on every slice are what made gguf's walk slow."""
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    parsed = gguf_file.parse(path)
    assert type(parsed.data) is np.ndarray and type(gguf.GGUFReader(path).data) is np.memmap
    assert bytes(parsed.data[:4]) == b"GGUF"


def write_settings_gguf(path, architecture: str, with_vocab_size: bool) -> None:
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    if with_vocab_size:
        writer.add_vocab_size(300)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"token{i}" for i in range(300)])
    writer.add_token_merges(["t o", "to k"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", np.zeros((300, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3", "gemma2", "gemma3"])
@pytest.mark.parametrize("with_vocab_size", [True, False])
def test_the_config_from_the_settings_alone_is_transformers_own(tmp_path, architecture, with_vocab_size):
    """transformers reads a copy of the header without the tokenizer's arrays: the same config as
    from the whole file, the vocabulary's size included where only the token list told it."""
    from transformers import AutoConfig

    path = tmp_path / "model.gguf"
    write_settings_gguf(path, architecture, with_vocab_size)
    expected = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name).to_dict()
    assert gguf_file.config_of(gguf_file.parse(path), path).to_dict() == expected
    assert expected["vocab_size"] == 300


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3", "gemma2", "gemma3"])
def test_the_tensor_names_map_as_transformers_maps_them(tmp_path, architecture):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    path = tmp_path / "model.gguf"
    write_settings_gguf(path, architecture, True)
    config = gguf_file.config_of(gguf_file.parse(path), path)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    kind = {"gemma3_text": "gemma3"}.get(config.model_type, config.model_type)
    processor = TENSOR_PROCESSORS.get(kind, TensorProcessor)(config=config.to_dict())
    mine = gguf_file.hf_names(model, processor)
    assert mine == get_gguf_hf_weights_map(model, processor)
    assert mine["blk.1.attn_q.weight"] == "model.layers.1.self_attn.q_proj.weight"
