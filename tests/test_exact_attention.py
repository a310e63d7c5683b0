"""Models run through transformers' forward (the path of architectures the lean decoder does not
run; Gemma 2's eager attention with capped scores stands for them, though the lean decoder runs
Gemma 2 itself) attend verified tokens exactly as decoding them alone does: with low-bit linears,
the logits of a verification equal those of decoding its tokens one by one, bit for bit."""
import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM

from app.engine.models.transformers_decoder import TransformersDecoder
from app.engine.models.decoder import cached
from app.engine.lowbit.modules import quantize_model

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, tie_word_embeddings=False,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
ARCHITECTURES = {
    "phi3": lambda: Phi3ForCausalLM(Phi3Config(**COMMON)),  # sdpa
    "mistral": lambda: MistralForCausalLM(MistralConfig(sliding_window=8, **COMMON)),  # sdpa, a sliding window
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(head_dim=16, sliding_window=8, **COMMON)),  # eager, capped scores
}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_verified_rows_equal_rows_decoded_alone(architecture):
    torch.manual_seed(0)
    model = quantize_model(ARCHITECTURES[architecture]().eval(), 4)
    assert architecture == "gemma2" or isinstance(cached(model), TransformersDecoder)  # their path
    together, alone = TransformersDecoder(model), TransformersDecoder(model)
    assert together.exact_rows
    prompt, tokens = torch.arange(3, 23) % 96, torch.tensor([11, 22, 33, 44, 55, 66])  # past the window of 8
    for cache in (together, alone):
        cache.forward(prompt, keep=1)
    verified = together.forward(tokens, keep=len(tokens))
    decoded = torch.cat([alone.forward(tokens[i : i + 1], keep=1) for i in range(len(tokens))])
    assert torch.equal(verified, decoded)
    # and a prompt read at once still equals transformers' own forward over the whole sequence
    with torch.no_grad():
        whole = model(torch.cat([prompt, tokens]).view(1, -1)).logits[0, -len(tokens):]
    assert torch.allclose(verified, whole, atol=1e-4, rtol=1e-4)
