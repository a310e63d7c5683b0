"""A lean forward pass for Llama/Qwen2/Qwen3/Gemma 2/Gemma 3 decoders with a preallocated KV cache.

transformers' forward builds masks, cache objects and output records on every call: about
20 ms per token on 2 CPU cores for the default pair, as much as a low-bit draft's arithmetic.
With the C++ kernel the whole layer stack is one call (lowbit/decoder.cpp); without it the same
layers run as a plain loop over the model's modules. Rollback is setting the cache length.
Models of other architectures keep transformers' path.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.nn import functional as F

from ..choices import CACHE_TYPES, DEFAULT_CACHE
from ..lowbit import kernel, skeleton
from ..lowbit.modules import LowBitEmbedding, LowBitLinear, embedding_scale, fuse_projections
from ..kv.kept_prefixes import PrefixStore, Snapshot

PREFILL_CHUNK = 256  # rows per native stack call (64 to 256 read a 2,000-token prompt equally fast)
CACHE_STEP = 1024  # tokens the cache grows by once it holds that many
# The native stack keeps keys and values in float16 unless asked for float32 (`--kv-cache`), as
# llama.cpp's cache does by default: half the memory, and half the bytes attention reads per token
# (at 2,800 cached tokens about 70 MB per draft token, 40% of its weights' bytes, in float32). The
# Python loop keeps float32.
CACHE_DTYPES = {name: getattr(torch, name) for name in CACHE_TYPES}
NATIVE_CACHE_DTYPE = CACHE_DTYPES[DEFAULT_CACHE]


def supports(model: nn.Module) -> bool:
    return skeleton.runs_lean(model.config) and hasattr(model, "model") and hasattr(model.model, "rotary_emb")


class LeanDecoder:
    reuses_prefix = True  # its cache can be rolled back to any length (see cached_model.keep_prefix)

    def __init__(self, model: nn.Module, vocab_width: int | None = None, cache_dtype: torch.dtype | None = None) -> None:
        """cache_dtype: the native stack's KV cache (default NATIVE_CACHE_DTYPE); the Python loop's is float32."""
        config = model.config
        self.model = model
        self.device = model.device
        self.vocab_width = vocab_width
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = skeleton.head_dim(config)
        self.head_norms = skeleton.has_head_norms(config)
        self.windows = skeleton.local_layers(config)  # {layer: its sliding window}
        self.norm_offset = skeleton.norm_offset(config)
        self.gemma = skeleton.is_gemma(config)
        self.attention_cap, self.logit_cap = skeleton.soft_caps(config)
        self.qkv, self.gate_up = fused_projections(model)
        self.stack = native_stack(model)  # None: the Python loop runs the layers
        self._embed = _embedding_lookup(model.model.embed_tokens)
        self._final_norm = _normaliser(model.model.norm, self.norm_offset)
        # Gemma 3's rotary embeddings of the global and the local layers; others use the model's own
        self._rotary_embeddings = ({kind: skeleton.RotaryEmbedding(config, kind) for kind in (skeleton.GLOBAL, skeleton.LOCAL)}
                                   if skeleton.local_rotary(config) else {skeleton.GLOBAL: model.model.rotary_emb})
        # Keys are stored transposed, in blocks for the native stack: its attention reads 16 keys'
        # component d at once, and a block's keys lie together in memory.
        self.key_block = kernel.native().KEY_BLOCK if self.stack is not None else None
        self.cache_dtype = (cache_dtype or NATIVE_CACHE_DTYPE) if self.stack is not None else torch.float32
        # per layer [1, kv_heads, head_dim, capacity], or [1, kv_heads, capacity / key_block, head_dim, key_block]
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []  # per layer [1, kv_heads, capacity, head_dim]
        # What the native stack is handed each pass: each layer's keys and values without the batch
        # dimension, and the rotary embedding's cos and sin [capacity, head_dim] of every position the
        # cache holds room for (None: worked out each pass, for rotary types that change with the
        # sequence). Made once, not on every pass: on a draft pass they would cost about 5% of it.
        self._stack_caches: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        self._rotary: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # by layer kind
        self.prefixes = PrefixStore()
        self.saved = None  # its copies on disk (saved_prefixes.SavedPrefixes), where the app keeps them
        self.reset()

    def reset(self) -> None:
        self.ids: list[int] = []  # the tokens whose keys and values are in the cache, in order

    @property
    def length(self) -> int:
        return len(self.ids)

    def rollback(self, length: int) -> None:
        """Forget everything after the first `length` cached tokens."""
        del self.ids[length:]

    @torch.inference_mode()
    def snapshot(self, max_tokens: int) -> Snapshot:
        """A copy of the cache's first max_tokens tokens."""
        n = min(self.length, max_tokens)
        keys = [k[:, :, : -(-n // self.key_block)].clone() if self.key_block else k[..., :n].clone() for k in self.keys]
        values = [v[:, :, :n].clone() for v in self.values]
        return Snapshot(self.ids[:n], (keys, values), sum(t.nbytes for t in keys + values))

    @property
    def bytes_per_token(self) -> int:
        """What each token adds to the cache."""
        return 2 * len(self.model.model.layers) * self.kv_heads * self.head_dim * self.cache_dtype.itemsize

    @property
    def cache_bytes(self) -> int:
        """The memory the live cache takes (all it holds room for)."""
        return sum(t.nbytes for t in self.keys + self.values)

    @torch.inference_mode()
    def restore(self, snapshot: Snapshot) -> None:
        """The cache becomes the snapshot's (which stays unchanged)."""
        n = len(snapshot.ids)
        self._reserve(n)
        for layer, (keys, values) in enumerate(zip(*snapshot.state)):
            if self.key_block:
                self.keys[layer][:, :, : keys.shape[2]] = keys
            else:
                self.keys[layer][..., :n] = keys
            self.values[layer][:, :, :n] = values
        self.ids = list(snapshot.ids)

    def _reserve(self, needed: int) -> None:
        capacity = self.values[0].shape[2] if self.values else 0
        if needed <= capacity:
            return
        # Doubling while small, then 1,024 tokens at a time: doubling had left up to half of a long
        # conversation's cache unused (235 MB at 4,100 tokens on the default target).
        capacity = max(needed, min(2 * capacity, capacity + CACHE_STEP), 256)
        layers = len(self.model.model.layers)
        if self.key_block:
            capacity = -(-capacity // self.key_block) * self.key_block
            key_shape = (1, self.kv_heads, capacity // self.key_block, self.head_dim, self.key_block)
        else:
            key_shape = (1, self.kv_heads, self.head_dim, capacity)
        keys = [torch.zeros(key_shape, device=self.device, dtype=self.cache_dtype) for _ in range(layers)]
        values = [torch.zeros(1, self.kv_heads, capacity, self.head_dim, device=self.device, dtype=self.cache_dtype)
                  for _ in range(layers)]
        for old, new in zip(self.keys, keys):
            if self.key_block:
                new[:, :, : old.shape[2]] = old
            else:
                new[..., : self.length] = old[..., : self.length]
        for old, new in zip(self.values, values):
            new[:, :, : self.length] = old[:, :, : self.length]
        tables = self._rotary
        if skeleton.static_rope(self.model.config):
            positions = torch.arange(capacity, device=self.device).view(1, capacity)
            tables = {kind: tuple(t[0] for t in rotary(torch.empty(0, device=self.device), positions))
                      for kind, rotary in self._rotary_embeddings.items()}
        # all swapped in one statement, after everything is made: a Ctrl-C in between would leave
        # caches longer than their rotary table
        self.keys, self.values, self._stack_caches, self._rotary = (
            keys, values, ([k[0] for k in keys], [v[0] for v in values]), tables)

    def _attention(self, q: torch.Tensor, index: int, start: int, scale: float, exact_rows: bool) -> torch.Tensor:
        """q [1, heads, n, head_dim] over the cached keys -> [1, heads, n, head_dim].

        exact_rows: each query row is computed by the very call that decodes it alone (one query
        over the keys up to it), so a verified token gets bit-identical attention to plain
        decoding. One batched call instead would change the reduction order with the batch's
        shape, and a near-tie could then flip a greedy token."""
        keys, values = self.keys[index].transpose(2, 3), self.values[index]
        n, end, window = q.shape[2], start + q.shape[2], self.windows.get(index)
        first = lambda last: 0 if window is None else max(0, last - window)  # of the keys a row ending at `last` sees
        if n == 1 or exact_rows:
            rows = [_attend(q[:, :, i : i + 1], keys[:, :, first(start + i + 1) : start + i + 1],
                            values[:, :, first(start + i + 1) : start + i + 1], scale, self.attention_cap)
                    for i in range(n)]
            return torch.cat(rows, dim=2)
        # A prefill at once: query i sees keys up to start + i, and within its window
        positions = torch.arange(start, end, device=self.device).view(n, 1)
        seen = torch.arange(end, device=self.device)[None, :]
        mask = (seen <= positions) & (seen > positions - (window or end + 1))
        return _attend(q, keys[:, :, :end], values[:, :, :end], scale, self.attention_cap, mask)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, keep: int, vocabulary=None) -> torch.Tensor:
        """token_ids [n] long, appended to the cache -> logits [keep, V] float32 of the last
        positions; with a DraftVocabulary, logits [keep, S] over its tokens only."""
        hidden = self.hidden(token_ids, keep)
        if vocabulary is not None:
            logits = vocabulary.logits(hidden)
        else:
            logits = self.model.lm_head(hidden)[:, : self.vocab_width].float()
        if self.logit_cap is not None:  # Gemma 2, as transformers computes it
            logits = torch.tanh(logits / self.logit_cap) * self.logit_cap
        return logits

    def feed(self, token_ids: torch.Tensor) -> None:
        """token_ids [n] long, appended to the cache, without the output layer (for the default
        target 191 MB of weights a prefill had read for logits nobody used)."""
        self.hidden(token_ids, keep=1)

    @torch.inference_mode()
    def hidden(self, token_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """token_ids [n] long, appended to the cache -> the final normalised hidden states
        [keep, D] of the last positions (what the output layer reads)."""
        n, start = token_ids.numel(), self.length
        end = start + n
        self._reserve(end)
        hidden = self._embed(token_ids.to(self.device))[None]  # [1, n, hidden]
        if self._rotary is not None:
            rotary = {kind: (cos[start:end], sin[start:end]) for kind, (cos, sin) in self._rotary.items()}
        else:
            positions = torch.arange(start, end, device=self.device).view(1, n)
            rotary = {kind: tuple(t[0] for t in embedding(hidden, positions))
                      for kind, embedding in self._rotary_embeddings.items()}
        if self.stack is not None:
            hidden = self._stack_in_chunks(hidden[0], rotary, start, keep)[None]
        else:
            hidden = self._layers(hidden, rotary, start, keep)
        self.ids += token_ids.tolist()
        return self._final_norm(hidden[0, -keep:])

    def _stack_in_chunks(self, hidden: torch.Tensor, rotary: dict, start: int, keep: int) -> torch.Tensor:
        """hidden [n, D] through the native stack, PREFILL_CHUNK rows per call -> the rows of the
        calls that hold the last `keep` rows [>= keep, D]. Every row's arithmetic is the same whatever
        the call's size (batch invariance), so the cache and logits equal one call's, without one
        call's buffers growing with n: a 3,900-token prompt took 61 s to read in one call, 37 s in
        chunks (the attention's scores alone had taken 370 MB per thread and layer)."""
        keys, values = self._stack_caches
        n, kept = hidden.shape[0], []
        (cos, sin), local = rotary[skeleton.GLOBAL], rotary.get(skeleton.LOCAL, (None, None))
        for first in range(0, n, PREFILL_CHUNK):
            last = min(n, first + PREFILL_CHUNK)
            part = lambda t: None if t is None else t[first:last]
            out = self.stack.forward(hidden[first:last], keys, values, part(cos), part(sin), start + first,
                                     part(local[0]), part(local[1]))
            if last > n - keep:
                kept.append(out)
        return torch.cat(kept) if len(kept) > 1 else kept[0]

    def _layers(self, hidden: torch.Tensor, rotary: dict, start: int, keep: int) -> torch.Tensor:
        """hidden [1, n, D] through every layer in Python (no C++ kernel), writing the cache.
        Rows whose logits are kept (a verification) get their attention one by one, exactly as
        plain decoding computes it; a prefill keeps one row and runs batched."""
        decoder = self.model.model
        n = hidden.shape[1]
        end = start + n
        norm = lambda module, x: _rms_norm(module, x, self.norm_offset)
        for index, layer in enumerate(decoder.layers):
            attention = layer.self_attn
            local = index in self.windows and skeleton.LOCAL in rotary
            cos, sin = (t[None] for t in rotary[skeleton.LOCAL if local else skeleton.GLOBAL])
            x = norm(layer.input_layernorm, hidden)
            if self.qkv[index] is not None:
                q, k, v = self.qkv[index](x).split(
                    [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
            else:
                q, k, v = attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)
            q = q.reshape(1, n, self.heads, self.head_dim)
            k = k.reshape(1, n, self.kv_heads, self.head_dim)
            if self.head_norms:
                q, k = norm(attention.q_norm, q), norm(attention.k_norm, k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = v.reshape(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            self.keys[index][..., start:end] = k.transpose(2, 3)
            self.values[index][:, :, start:end] = v
            out = self._attention(q, index, start, attention.scaling, exact_rows=keep > 1)
            out = attention.o_proj(out.transpose(1, 2).reshape(1, n, self.heads * self.head_dim))
            if self.gemma:
                hidden = hidden + norm(layer.post_attention_layernorm, out)
                x = norm(layer.pre_feedforward_layernorm, hidden)
            else:
                hidden = hidden + out
                x = norm(layer.post_attention_layernorm, hidden)
            if self.gate_up[index] is not None:
                gate, up = self.gate_up[index](x).chunk(2, dim=-1)
                out = layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
            else:
                out = layer.mlp(x)
            hidden = hidden + (norm(layer.post_feedforward_layernorm, out) if self.gemma else out)
        return hidden


_STACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def native_stack(model: nn.Module):
    """The C++ layer stack over the model's packed weights (shared, never copied), or None when
    the kernel is not built or a projection is not low-bit."""
    module = kernel.native()
    if module is None:
        return None
    if model not in _STACKS:
        qkv, gate_up = fused_projections(model)
        config, layers = model.config, []
        offset, windows = skeleton.norm_offset(config), skeleton.local_layers(config)
        weight = lambda norm: _norm_weight(norm, offset).contiguous()
        for index, layer in enumerate(model.model.layers):
            attention, mlp = layer.self_attn, layer.mlp
            parts = {
                "qkv": [qkv[index]] if qkv[index] is not None else [attention.q_proj, attention.k_proj, attention.v_proj],
                "output": attention.o_proj,
                "gate_up": [gate_up[index]] if gate_up[index] is not None else [mlp.gate_proj, mlp.up_proj],
                "down": mlp.down_proj,
            }
            if not all(isinstance(m, LowBitLinear) for m in [*parts["qkv"], parts["output"], *parts["gate_up"], parts["down"]]):
                _STACKS[model] = None
                return None
            to_native = lambda m: module.Projection(*m.packed.tensors().values(), m.bias, m.group, m.bits, m.out_features)
            norms = ({"q_norm": weight(attention.q_norm), "k_norm": weight(attention.k_norm)}
                     if skeleton.has_head_norms(config) else {})
            if skeleton.is_gemma(config):  # the norm before the feed-forward layer, and after each part
                norms |= {"attention_out_norm": weight(layer.post_attention_layernorm),
                          "feed_forward_out_norm": weight(layer.post_feedforward_layernorm)}
                feed_forward_norm = layer.pre_feedforward_layernorm
            else:
                feed_forward_norm = layer.post_attention_layernorm
            layers.append(module.Layer(
                weight(layer.input_layernorm), weight(feed_forward_norm),
                [to_native(m) for m in parts["qkv"]], to_native(parts["output"]),
                [to_native(m) for m in parts["gate_up"]], to_native(parts["down"]), window=windows.get(index, 0),
                **norms))
        _STACKS[model] = module.LayerStack(layers, config.num_attention_heads, config.num_key_value_heads,
                                           skeleton.head_dim(config), model.model.layers[0].self_attn.scaling,
                                           config.rms_norm_eps, gelu=skeleton.is_gemma(config),
                                           cap=skeleton.soft_caps(config)[0] or 0.0)
    return _STACKS[model]


def fused_projections(model: nn.Module) -> tuple[list, list]:
    """Per layer, q/k/v and gate/up as one kernel call each where their formats agree (None:
    separate calls). Made once per model (a model from the store holds them already): every
    engine on the model shares them, and the weights stay in memory once (the original modules
    view slices of the fused ones)."""
    layers = model.model.layers
    fuse_projections(layers)
    return ([getattr(layer.self_attn, "fused_qkv", None) for layer in layers],
            [getattr(layer.mlp, "fused_gate_up", None) for layer in layers])


# The embedding lookup and the final norm go straight to the kernel where it is built: the modules'
# Python checks on the way would cost a draft pass about 4% (its caches are cold by then).
def _embedding_lookup(embedding: nn.Module):
    """-> a function of token ids [n] long -> their embeddings [n, D] float32."""
    module = kernel.native()
    if module is not None and isinstance(embedding, LowBitEmbedding):
        packed, scale = embedding.packed, embedding_scale(embedding)
        tensors = tuple(packed.tensors().values())
        if scale is not None:
            return lambda token_ids: module.rows(token_ids, *tensors, packed.group, packed.bits) * scale
        return lambda token_ids: module.rows(token_ids, *tensors, packed.group, packed.bits)
    return lambda token_ids: embedding(token_ids).float()


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, cap: float | None,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """q [1, heads, n, head_dim] over keys, values [1, kv_heads, m, head_dim] -> [1, heads, n, head_dim];
    cap: the scores' soft cap (Gemma 2), computed as transformers' eager attention does (torch's
    scaled_dot_product_attention has none)."""
    if cap is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale,
                                              enable_gqa=keys.shape[1] != q.shape[1])
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.tanh(q @ keys.transpose(2, 3) * scale / cap) * cap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ values


def _normaliser(norm: nn.Module, offset: float):
    """-> a function of x [n, D] float32 -> its RMSNorm, as _rms_norm computes it."""
    module = kernel.native()
    if module is not None and norm.weight.dtype == torch.float32:
        weight, eps = _norm_weight(norm, offset), _epsilon(norm)
        return lambda x: module.rms_norm(x, weight, eps)
    return lambda x: _rms_norm(norm, x, offset)


def _rms_norm(norm: nn.Module, x: torch.Tensor, offset: float) -> torch.Tensor:
    """One pass instead of the module's six tensor ops (float32 throughout, as the module computes)."""
    return kernel.rms_norm(x, _norm_weight(norm, offset), _epsilon(norm))


def _norm_weight(norm: nn.Module, offset: float) -> torch.Tensor:
    """What an RMSNorm scales by: its weight, or Gemma's 1 + weight (float32, as transformers adds it)."""
    return norm.weight.float() + offset if offset else norm.weight.float()


def _epsilon(norm: nn.Module) -> float:
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps  # Gemma's module calls it eps


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of x [1, heads, n, head_dim] with cos, sin [1, n, head_dim], as
    transformers' apply_rotary_pos_emb computes it."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]
