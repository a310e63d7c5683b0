"""The C++ entry points check every size they index by: a tensor too short for what the others
say (a hostile file's, a cut one's) is refused with an error, never read past its end."""
import pytest
import torch

from app.engine.models.decoder import cached
from app.engine.lowbit import kernel, skeleton
from app.engine.lowbit.packing import quantize_float
from tests.tiny import wide_low_bit

pytestmark = pytest.mark.skipif(kernel.native() is None, reason="the C++ kernel is not built on this machine")


@pytest.fixture(scope="module")
def weight():
    return quantize_float(torch.randn(64, 64), 4, 32)  # [N 64, K 64]: 4 tiles, 2 groups, float16 scales


@pytest.fixture(scope="module")
def coded_weight():
    return quantize_float(torch.randn(64, 64), 3, 32)  # int8 codes times a float16 step


def call_linear(weight, x=None, **replaced):
    tensors = {**weight.tensors(), **replaced}
    return kernel.native().linear(torch.randn(2, 64) if x is None else x, *tensors.values(), weight.group, weight.bits)


def test_a_whole_weight_runs(weight):
    assert call_linear(weight).shape == (2, 64)


@pytest.mark.parametrize("cut", ["q", "scale", "min", "scale_step", "min_step"])
def test_a_packed_tensor_shorter_than_the_others_say_is_refused(weight, coded_weight, cut):
    weight = coded_weight if cut.endswith("step") else weight
    assert call_linear(weight).shape == (2, 64)
    original = weight.tensors()[cut]
    shorter = (original.reshape(-1)[: original.numel() // 2] if cut == "q" else original[:1] if cut.endswith("step")
               else original[:, :1])
    with pytest.raises(RuntimeError):
        call_linear(weight, **{cut: shorter.contiguous()})


def test_a_weight_of_no_tiles_is_refused_not_divided_by(weight):
    empty = {name: tensor[:0] for name, tensor in weight.tensors().items()}
    with pytest.raises(RuntimeError, match="at least one tile"):
        kernel.native().rows(torch.tensor([0]), *empty.values(), weight.group, weight.bits)


def test_rms_norm_refuses_a_weight_shorter_than_the_rows():
    with pytest.raises(RuntimeError, match="weight \\[D\\]"):
        kernel.native().rms_norm(torch.randn(3, 64), torch.ones(63), 1e-6)


def test_the_layer_stack_refuses_a_rotary_table_shorter_than_the_rows():
    decoder = cached(wide_low_bit(1, 4).model)
    decoder.feed(torch.arange(5))
    keys, values = decoder._stack_caches
    cos, sin = decoder._rotary[skeleton.GLOBAL]
    hidden = torch.randn(4, 64)
    with pytest.raises(RuntimeError, match="cos and sin"):
        decoder.stack.forward(hidden, keys, values, cos[5:8], sin[5:8], 5)
    with pytest.raises(RuntimeError, match="as many as the values hold"):
        decoder.stack.forward(hidden, keys, [v[:, :8] for v in values], cos[5:9], sin[5:9], 5)
    assert decoder.stack.forward(hidden, keys, values, cos[5:9], sin[5:9], 5).shape == (4, 64)
