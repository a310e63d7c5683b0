"""The module tree of a Llama/Qwen2/Qwen3/Gemma 2/Gemma 3 decoder without transformers' modeling code.

A low-bit model from the cache runs only through lean_decoder.LeanDecoder, which needs the
tree's modules and the config. Building transformers' own model for it imported transformers'
modeling code (torch._dynamo, torch.distributed and more): about 2 s and 90 MB of every later
start. The modules here carry transformers' names, so the stored tensors load by name;
`as_transformers` wraps the same modules in transformers' model where its loops need one (Hugging
Face assisted generation in `bench speed`).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .modules import embedding_scale

SUPPORTED = {"qwen2", "llama", "qwen3", "gemma2", "gemma3_text"}  # transformers names a Gemma 3 GGUF's model gemma3_text
# Rotary types whose frequencies do not change with the sequence (transformers' dynamic ones do)
STATIC_ROPE = {"default", "linear", "llama3", "yarn"}
LOCAL, GLOBAL = "sliding_attention", "full_attention"  # Gemma 3's layer types


def runs_lean(config) -> bool:
    """Whether lean_decoder.LeanDecoder runs a model of this config."""
    if config.model_type not in SUPPORTED:
        return False
    if is_gemma(config):
        return (config.hidden_activation == "gelu_pytorch_tanh"
                and not getattr(config, "use_bidirectional_attention", False))
    return (not getattr(config, "use_sliding_window", False) and getattr(config, "pretraining_tp", 1) == 1
            and config.hidden_act == "silu")


def is_gemma(config) -> bool:
    """Gemma 2 and 3: norms scale by 1 + weight, a norm after attention and after the feed-forward
    layer too, embeddings scaled by the width's square root, GeGLU (tanh GELU), queries scaled by
    a scalar of their own, and local layers that attend over a sliding window; Gemma 2 also
    soft-caps attention scores and logits, Gemma 3 normalises query and key heads and gives its
    local layers rotary frequencies of their own."""
    return config.model_type in ("gemma2", "gemma3_text")


def local_rotary(config) -> bool:
    """Whether local layers have rotary frequencies of their own (Gemma 3)."""
    return config.model_type == "gemma3_text"


def soft_caps(config) -> tuple[float | None, float | None]:
    """Gemma 2's soft caps, cap * tanh(x / cap), of attention scores and of the logits (or None)."""
    if not is_gemma(config):
        return None, None
    return getattr(config, "attn_logit_softcapping", None), getattr(config, "final_logit_softcapping", None)


def can_build(config) -> bool:
    """Whether LeanDecoder runs this config and its rotary embedding is one built here."""
    return runs_lean(config) and static_rope(config)


def static_rope(config) -> bool:
    """Whether the rotary embedding of a position is the same whatever else is in the sequence."""
    kinds = (GLOBAL, LOCAL) if local_rotary(config) else (GLOBAL,)
    return all(_rope(config, kind)["rope_type"] in STATIC_ROPE for kind in kinds)


def divide_rope_frequencies(model: nn.Module) -> None:
    """Divides a just-built model's rotary frequencies by its config's rope_freq_divisors, where a
    GGUF gave it some (its rope_freqs tensor: how llama.cpp's files carry Llama 3.1 and later's
    rotary scaling, which transformers' reading drops, so their angles would differ from llama.cpp's
    and the original model's). Every place that builds a model calls this once."""
    divisors = getattr(model.config, "rope_freq_divisors", None)
    if divisors is None:
        return
    rotary = model.model.rotary_emb
    for name in ("inv_freq", "original_inv_freq"):  # transformers keeps a copy to return to
        if hasattr(rotary, name):
            setattr(rotary, name, getattr(rotary, name) / torch.tensor(divisors, dtype=torch.float32))


def local_layers(config) -> dict[int, int]:
    """{layer index: its sliding window} of the layers that attend over one (Gemma's local
    layers: a token sees the window's last keys, itself included)."""
    if not is_gemma(config):
        return {}
    return {i: config.sliding_window for i, kind in enumerate(config.layer_types) if kind == LOCAL}


def norm_offset(config) -> float:
    """What an RMSNorm adds to its weight before scaling (Gemma's norms scale by 1 + weight)."""
    return 1.0 if is_gemma(config) else 0.0


def head_dim(config) -> int:
    """Components per attention head (configs that do not say split the hidden size evenly)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def has_head_norms(config) -> bool:
    """Whether each query and key head is RMS-normalised before the rotary embedding (Qwen3, Gemma 3)."""
    return config.model_type in ("qwen3", "gemma3_text")


def _rope(config, kind: str = GLOBAL) -> dict:
    parameters = getattr(config, "rope_parameters", None) or {}
    if local_rotary(config):
        parameters = parameters[kind]
    return {"rope_type": "default", **parameters}


class RMSNorm(nn.Module):
    """The weight and epsilon LeanDecoder normalises with (its kernel does the arithmetic)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.variance_epsilon = eps


class RotaryEmbedding(nn.Module):
    """cos and sin of each position, as transformers' Llama/Qwen2 rotary embedding computes them
    (kind: Gemma 3's layer type whose frequencies these are)."""

    def __init__(self, config, kind: str = GLOBAL) -> None:
        super().__init__()
        rope = _rope(config, kind)
        if rope["rope_type"] == "default":
            size = head_dim(config)
            inverse = 1.0 / (rope["rope_theta"] ** (torch.arange(0, size, 2, dtype=torch.float) / size))
            self.attention_scaling = 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            extra = {"layer_type": kind} if local_rotary(config) else {}
            inverse, self.attention_scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, torch.device("cpu"), **extra)
        self.register_buffer("inv_freq", inverse.float(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: only its device and dtype; position_ids [1, n] -> cos, sin [1, n, head_dim]."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * self.attention_scaling).to(x.dtype), (angles.sin() * self.attention_scaling).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        heads, kv_heads, size = config.num_attention_heads, config.num_key_value_heads, head_dim(config)
        bias = config.model_type == "qwen2" or getattr(config, "attention_bias", False)
        self.q_proj = nn.Linear(config.hidden_size, heads * size, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * size, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * size, bias=bias)
        self.o_proj = nn.Linear(heads * size, config.hidden_size, bias=getattr(config, "attention_bias", False))
        if has_head_norms(config):
            self.q_norm, self.k_norm = RMSNorm(size, config.rms_norm_eps), RMSNorm(size, config.rms_norm_eps)
        self.scaling = (config.query_pre_attn_scalar if is_gemma(config) else size) ** -0.5


class MLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.act_fn = (lambda x: F.gelu(x, approximate="tanh")) if is_gemma(config) else F.silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if is_gemma(config):
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


def layer_norm_names(config) -> tuple[str, ...]:
    """A layer's RMSNorms: Llama's two (before attention, before the feed-forward layer), or
    Gemma 3's four (before and after each)."""
    if is_gemma(config):
        return ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
    return ("input_layernorm", "post_attention_layernorm")


class ScaledEmbedding(nn.Embedding):
    """An embedding whose rows are multiplied by scalar_embed_scale where it is not None (Gemma)."""

    scalar_embed_scale: float | None = None

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        rows = super().forward(token_ids)
        return rows if self.scalar_embed_scale is None else rows * embedding_scale(self)


class Decoder(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        # A given weight skips the initialisation (its normal_ imports torch._dynamo: 1.6 s)
        self.embed_tokens = ScaledEmbedding(config.vocab_size, config.hidden_size,
                                            _weight=torch.empty(config.vocab_size, config.hidden_size), _freeze=True)
        # Gemma's embeddings are multiplied by the width's square root (a low-bit one in the store
        # takes the scale in its place)
        self.embed_tokens.scalar_embed_scale = config.hidden_size**0.5 if is_gemma(config) else None
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """model.model (the decoder) and model.lm_head, as transformers' *ForCausalLM names them.
    Built on the meta device (no memory, no initialisation): the loader puts every weight in place."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers import GenerationConfig

        self.config = config
        self.generation_config = GenerationConfig.from_model_config(config)
        with torch.device("meta"):
            self.model = Decoder(config)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # Real buffers, computed from the config (outside the meta device, whose arange imports torch._dynamo)
        self.model.rotary_emb = RotaryEmbedding(config)

    @property
    def device(self) -> torch.device:
        return self.model.rotary_emb.inv_freq.device


def as_transformers(model: nn.Module) -> nn.Module:
    """transformers' own model holding the same modules (weights shared, nothing copied), for
    loops that need one; a transformers model is returned as it is."""
    if not isinstance(model, CausalLM):
        return model
    wrapped = empty_transformers_model(model.config)
    wrapped.generation_config = model.generation_config
    wrapped.model.embed_tokens, wrapped.lm_head = model.model.embed_tokens, model.lm_head
    wrapped.model.norm.weight = model.model.norm.weight
    for theirs, ours in zip(wrapped.model.layers, model.model.layers):
        for name in layer_norm_names(model.config):  # theirs compute, ours only hold
            getattr(theirs, name).weight = getattr(ours, name).weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(theirs.self_attn, name, getattr(ours.self_attn, name))
        if has_head_norms(model.config):
            theirs.self_attn.q_norm.weight = ours.self_attn.q_norm.weight
            theirs.self_attn.k_norm.weight = ours.self_attn.k_norm.weight
        theirs.mlp = ours.mlp
    return wrapped.eval()


def empty_transformers_model(config) -> nn.Module:
    """transformers' model for a config, its parameters on the meta device and not initialised
    (every weight is put in place afterwards)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with init_empty_weights(), no_init_weights():
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
