"""The GGUF header parsed once over a plain view of the file: the same fields and tensors as
gguf's own reader, lent to every reader of that file inside the block and to no other."""
import gguf
import numpy as np

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


def test_shared_reader_is_lent_inside_the_block_only(tmp_path):
    path, other = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_gguf(path)
    write_gguf(other, vocabulary=10)
    original = gguf.GGUFReader
    with gguf_file.shared_reader(path) as reader:
        assert gguf.GGUFReader(str(path)) is reader  # as transformers calls it, by a string path
        assert len(gguf.GGUFReader(other).fields["tokenizer.ggml.tokens"].data) == 10  # parsed afresh
    assert gguf.GGUFReader is original
