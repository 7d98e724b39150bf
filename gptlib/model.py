"""A GPT-style decoder-only transformer, written in the order of the book's chapters.

Chapter 2 looks token ids up in an embedding table, chapter 3 adds their positions, chapter 4
projects the vectors to queries, keys and values and splits them into heads, chapter 5 scores and
scales, chapter 6 masks the future and takes the softmax, chapter 7 sums the values with those
weights and mixes the heads with W_o, chapter 8 wraps attention and a feed-forward network into a
block with norms and residual connections, and chapter 9 stacks the blocks and turns the last
vectors into logits (:class:`GPT`). Chapter 13's switches for a modern (Llama-style) model sit
beside the pieces they replace: rotary positions next to the sinusoidal table, grouped-query
attention next to the heads, RMSNorm next to LayerNorm, SwiGLU next to the feed-forward network.

This is the code the chapters build and nothing else: one explicit attention path (plus PyTorch's
``F.scaled_dot_product_attention`` as the fast alternative, ``fused_attention``), the plain
embedding lookup and ``F.cross_entropy``. The faster training paths live in :mod:`gptlib.fast`,
each tested against the function here that it equals. Generation's KV cache lives in
:mod:`gptlib.kv_cache` and reaches the attention layers through the ``cache`` argument.

Shapes use B = batch, T = sequence length, C = d_model, H = heads, hs = head size (C // H),
G = key/value heads, V = vocabulary size.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from gptlib.checks import check_token_ids
from gptlib.config import ACTIVATIONS, GPTConfig  # GPTConfig is re-exported from here too

# ---- Chapter 2: token embeddings ----------------------------------------------------------------
# A token id selects one row of a learned (V, C) table: ``nn.Embedding``, looked up in GPT.embed.

# ---- Chapter 3: positions -----------------------------------------------------------------------


def sinusoidal_positional_encoding(
    T: int, d_model: int, base: float = 10_000.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The fixed sin/cos table of "Attention Is All You Need", shape ``(T, d_model)``.

    ``PE[pos, 2i] = sin(pos / base^(2i/d_model))`` and ``PE[pos, 2i+1] = cos(same angle)``.
    """
    if T < 1 or d_model < 2 or d_model % 2:
        raise ValueError(f"need T >= 1 and an even d_model >= 2, got T={T}, d_model={d_model}")
    pos = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)
    angle = pos / base ** (two_i / d_model)  # (T, d_model/2)
    pe = torch.empty(T, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.to(dtype)


# Chapter 13 replaces the table with rotary position embeddings (RoPE): queries and keys are
# turned by an angle that grows with the position, inside attention.


def rope_cos_sin(
    T: int, head_size: int, base: float = 10_000.0, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embeddings' cosines and sines for positions start..start+T-1 (chapter 13).

    RoPE turns pairs of a query's (and a key's) numbers by an angle that grows with the position.
    Pair ``i`` is made of the numbers ``i`` and ``i + head_size/2`` (the layout of Hugging Face's
    Llama) and turns by ``position * base^(-2i/head_size)`` radians, the speeds of chapter 3's
    sinusoidal table. Returns ``(cos, sin)``, each (T, head_size) with every angle written twice.
    """
    if T < 1 or head_size < 2 or head_size % 2:
        raise ValueError(f"need T >= 1 and an even head_size, got T={T}, head_size={head_size}")
    speeds = base ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)  # (hs/2,)
    pos = torch.arange(start, start + T, dtype=torch.float64)[:, None]  # (T, 1)
    angle = (pos * speeds).repeat(1, 2)  # (T, hs): pair i's angle at columns i and i + hs/2
    return torch.cos(angle).float(), torch.sin(angle).float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., hs) -> (..., hs): each pair (a, b) = (x[i], x[i + hs/2]) becomes (-b, a)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn every pair of x (..., T, hs) by its angle: (a, b) -> (a cos - b sin, a sin + b cos)."""
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


# ---- Chapter 4: queries, keys, values and heads -------------------------------------------------
# W_q, W_k and W_v are Linear layers of MultiHeadAttention (chapter 7 assembles it).


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, C) -> (B, H, T, hs): give each head its own slice of the channels."""
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, hs) -> (B, T, C): concatenate the heads' outputs side by side."""
    B, H, T, hs = x.shape
    return x.transpose(1, 2).contiguous().view(B, T, H * hs)


# Chapter 13's grouped-query attention: fewer key/value heads, each shared by several query heads.


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, G, T, hs) -> (B, G * n_rep, T, hs): key/value head g serves the query heads
    g * n_rep ... (g + 1) * n_rep - 1 (grouped-query attention, chapter 13)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


# ---- Chapter 5: scores and scaling --------------------------------------------------------------


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """How well each query matches each key, scaled: Q Kᵀ / √d_k.

    ``q``: (..., Tq, d_k), ``k``: (..., Tk, d_k) -> (..., Tq, Tk). Dividing by √d_k keeps the
    scores' variance from growing with the head size (it is 1 for unit-variance q and k), so a
    wider head does not by itself make the softmax sharper.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k need the same last dimension, got {q.shape} and {k.shape}")
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Tq, Tk)


# ---- Chapter 6: the causal mask and the softmax -------------------------------------------------


def causal_mask(
    T: int, device: torch.device | str | None = None, n_keys: int | None = None
) -> torch.Tensor:
    """Boolean ``(T, T)`` mask, True where query ``i`` may see key ``j`` (that is, ``j <= i``).

    With ``n_keys`` (generation with a cache) the T queries are the *last* T of ``n_keys``
    positions: the mask is ``(T, n_keys)`` and query ``i`` sees keys ``0..n_keys - T + i``.
    """
    n_keys = T if n_keys is None else n_keys
    return torch.ones(T, n_keys, dtype=torch.bool, device=device).tril(n_keys - T)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention weights: the scores (..., Tq, Tk) with the masked ones set to -inf, then a
    softmax over the keys. Each row sums to 1; masked weights are exactly 0."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


# ---- Chapter 7: the weighted sum of the values, and W_o -----------------------------------------


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q Kᵀ / √d_k, masked) V, written out, returning the output **and** the weights.

    ``q``: (..., Tq, d_k), ``k``: (..., Tk, d_k), ``v``: (..., Tk, d_v). ``mask`` is boolean and
    broadcastable to (..., Tq, Tk), True where attending is allowed. Returns ``(out, weights)`` with
    shapes (..., Tq, d_v) and (..., Tq, Tk); masked weights are exactly 0. ``dropout_p`` zeroes
    that share of the weights in training (chapter 10) and scales the rest by 1 / (1 - p).
    """
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v need the same length, got {k.shape} and {v.shape}")
    weights = masked_softmax(attention_scores(q, k), mask)  # (..., Tq, Tk)
    if dropout_p > 0.0:
        keep = torch.rand(weights.shape, generator=generator, device=weights.device) >= dropout_p
        weights = weights * keep / (1.0 - dropout_p)
    return weights @ v, weights


class LayerCache(Protocol):
    """What an attention layer needs from a KV cache (see :class:`gptlib.kv_cache.KVCache`)."""

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys/values (B, G, T, hs); return all of them so far (B, G, T_all, hs)."""
        ...


Rope = tuple[torch.Tensor, torch.Tensor]  # RoPE's (cos, sin) for the positions fed, (T, hs) each


class MultiHeadAttention(nn.Module):
    """Masked multi-head self-attention with visible W_q, W_k, W_v and W_o (chapters 4-7).

    ``fused=False`` runs the book's steps (:func:`scaled_dot_product_attention`); ``fused=True``
    computes the same with ``F.scaled_dot_product_attention``, faster. With ``n_kv_heads`` below
    ``n_heads`` (grouped-query attention, chapter 13) W_k and W_v make only ``n_kv_heads`` heads,
    each shared by ``n_heads / n_kv_heads`` query heads; a KV cache stores only those.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        fused: bool = False,
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(
                f"d_model ({d_model}) must be divisible by n_heads ({n_heads}), and n_heads by "
                f"n_kv_heads ({n_kv_heads})"
            )
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_size = d_model // n_heads
        self.dropout = dropout
        self.fused = fused
        kv_width = n_kv_heads * self.head_size
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, kv_width, bias=bias)
        self.W_v = nn.Linear(d_model, kv_width, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def project_qkv(
        self, x: torch.Tensor, rope: Rope | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Chapter 4: queries (B, H, T, hs) and keys, values (B, G, T, hs) for x (B, T, C); RoPE
        turns the queries and keys when given (chapter 13)."""
        if x.dim() != 3 or x.shape[-1] != self.n_heads * self.head_size:
            raise ValueError(
                f"expected input of shape (B, T, {self.n_heads * self.head_size}), "
                f"got {tuple(x.shape)}"
            )
        q = split_heads(self.W_q(x), self.n_heads)  # (B, H, T, hs)
        k = split_heads(self.W_k(x), self.n_kv_heads)  # (B, G, T, hs)
        v = split_heads(self.W_v(x), self.n_kv_heads)  # (B, G, T, hs)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def share_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, G, T, hs) keys and values -> (B, H, T, hs): one copy per query head they serve."""
        n_rep = self.n_heads // self.n_kv_heads
        return repeat_kv(k, n_rep), repeat_kv(v, n_rep)

    def forward(
        self, x: torch.Tensor, cache: LayerCache | None = None, rope: Rope | None = None
    ) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C). With a ``cache``, x holds only the new tokens and they also
        attend to the cached keys and values (the cache stores theirs). ``rope``: the new
        tokens' (cos, sin) when the model uses rotary positions."""
        q, k, v = self.project_qkv(x, rope)  # (B, H, T, hs), (B, G, T, hs), (B, G, T, hs)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, G, T_all, hs): the cached positions, then the new
        out = self._attend(q, *self.share_kv(k, v))  # (B, H, T, hs)
        return self.resid_dropout(self.W_o(merge_heads(out)))  # (B, T, C)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Chapters 5-7 on (B, H, T, hs) queries and (B, H, T_all, hs) keys and values."""
        T, T_all = q.shape[-2], k.shape[-2]
        p = self.dropout if self.training else 0.0
        if not self.fused:
            mask = causal_mask(T, q.device, n_keys=T_all)  # (T, T_all)
            return scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)[0]
        if T == T_all:  # no cached positions: the plain causal mask, known to the kernel
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=T > 1)
        mask = None if T == 1 else causal_mask(T, q.device, n_keys=T_all)  # 1 query sees all
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        """The attention weights (B, H, T, T) for x (B, T, C), by the book's explicit steps
        (dropout follows the train/eval mode)."""
        q, k, v = self.project_qkv(x, rope)
        k, v = self.share_kv(k, v)
        p = self.dropout if self.training else 0.0
        return scaled_dot_product_attention(q, k, v, causal_mask(q.shape[-2], x.device), p)[1]


# ---- Chapter 8: the block: norms, the feed-forward network, residual connections ----------------


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm written out: normalise each vector to mean 0 and variance 1, then scale/shift."""
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False)  # the biased variance, as nn.LayerNorm
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


# Chapter 13's RMSNorm: LayerNorm without the mean.


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    """RMSNorm written out (chapter 13): divide each vector by its root mean square, then scale.

    LayerNorm without the mean: nothing is subtracted and there is no shift.
    """
    y = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def make_norm(config: GPTConfig) -> nn.Module:
    """The normalisation layer ``config.norm_type`` names: LayerNorm or RMSNorm (no bias)."""
    if config.norm_type == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)


class FeedForward(nn.Module):
    """The position-wise network: Linear(C -> d_ff), activation, Linear(d_ff -> C)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS or activation == "swiglu":
            allowed = tuple(a for a in ACTIVATIONS if a != "swiglu")
            raise ValueError(
                f"activation must be one of {allowed}, got {activation!r} (SwiGLU is its own "
                "layer: SwiGLUFeedForward)"
            )
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.activation = nn.ReLU() if activation == "relu" else nn.GELU()
        if activation == "gelu_tanh":
            self.activation = nn.GELU(approximate="tanh")
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear2(self.activation(self.linear1(x))))  # (B, T, C)


# Chapter 13's gated feed-forward network.


class SwiGLUFeedForward(nn.Module):
    """The gated feed-forward network of Llama (chapter 13): down(silu(gate(x)) * up(x)).

    ``gate`` decides, number by number, how much of ``up``'s output passes;
    SiLU(z) = z * sigmoid(z).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(self.gate(x)) * self.up(x)  # (B, T, d_ff)
        return self.dropout(self.down(hidden))  # (B, T, C)


def make_feed_forward(config: GPTConfig) -> nn.Module:
    """The feed-forward network ``config.activation`` names (SwiGLU or a two-layer network)."""
    c = config
    if c.activation == "swiglu":
        return SwiGLUFeedForward(c.d_model, c.d_ff, c.dropout, c.bias)
    return FeedForward(c.d_model, c.d_ff, c.activation, c.dropout, c.bias)


class TransformerBlock(nn.Module):
    """Attention then feed-forward, each wrapped in a residual connection and a norm.

    ``norm_placement="post"`` (the 2017 paper): x = LN(x + sublayer(x)).
    ``norm_placement="pre"`` (GPT-2 and most code since): x = x + sublayer(LN(x)).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        c = config
        self.norm_placement = c.norm_placement
        self.ln1 = make_norm(c)
        self.attn = MultiHeadAttention(
            c.d_model, c.n_heads, c.dropout, c.bias, c.fused_attention, c.n_kv_heads
        )
        self.ln2 = make_norm(c)
        self.ffn = make_feed_forward(c)

    def forward(
        self, x: torch.Tensor, cache: LayerCache | None = None, rope: Rope | None = None
    ) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C); ``cache`` and ``rope`` go to the attention layer."""
        if self.norm_placement == "pre":
            x = x + self.attn(self.ln1(x), cache, rope)
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.attn(x, cache, rope))
        return self.ln2(x + self.ffn(x))

    def attention_weights(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        """The block's attention weights (B, H, T, T) for its input x (B, T, C)."""
        pre = self.norm_placement == "pre"
        return self.attn.attention_weights(self.ln1(x) if pre else x, rope)


# ---- Chapter 9: the whole model and its logits --------------------------------------------------


class ModelCache(Protocol):
    """What :class:`GPT` needs from a KV cache (see :class:`gptlib.kv_cache.KVCache`)."""

    length: int  # positions cached so far: the next token gets position ``length``

    def layer(self, i: int) -> LayerCache: ...
    def advance(self, T: int) -> None: ...


class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V), and the loss when targets are given."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model)
        self.position_embedding = None
        if c.positions == "learned":
            self.position_embedding = nn.Embedding(c.context_length, c.d_model)
        self.make_position_tables()
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(c) for _ in range(c.n_blocks))
        self.final_norm = make_norm(c) if c.final_norm else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight
        self.apply(self._init_weights)

    def make_position_tables(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the position tables that are not trained and not saved: the sinusoidal
        table, or RoPE's cosines and sines (rope: nothing is added to the tokens, attention
        turns queries and keys). Also used after building the model on the meta device."""
        c = self.config
        if c.positions == "sinusoidal":
            pe = sinusoidal_positional_encoding(c.context_length, c.d_model)
            self.register_buffer("positional_encoding", pe.to(device), persistent=False)
        elif c.positions == "rope":
            cos, sin = rope_cos_sin(c.context_length, c.head_size, c.rope_base)
            self.register_buffer("rope_cos", cos.to(device), persistent=False)  # (ctx, hs)
            self.register_buffer("rope_sin", sin.to(device), persistent=False)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # Every Linear and Embedding weight drawn from N(0, 0.02^2), every Linear bias zero; the
        # norms keep PyTorch's scale 1 and shift 0. This is GPT-2's 0.02 but not all of GPT-2's
        # scheme: GPT-2 also divides the std of the two layers that write into the residual stream
        # (attention's W_o and the feed-forward's second layer) by sqrt(2 * n_blocks), so that
        # the stream's variance at the last block does not grow with depth. The book leaves that
        # factor out; its stored runs were trained from this initialisation.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def check_input(self, idx: torch.Tensor, start: int = 0) -> None:
        """Raise a clear error unless ``idx`` is a (B, T) tensor of the model's token ids that
        fits the context after ``start`` cached positions."""
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
            shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise ValueError(f"expected token ids of shape (batch, time), got {shape}")
        T, ctx = idx.shape[1], self.config.context_length
        if T == 0:
            raise ValueError("the input is empty: give at least one token")
        if start >= ctx:
            raise ValueError(
                f"the KV cache is full: it holds {start} positions, the model's context_length; "
                "start a new cache (or reset() it) and feed the last tokens again"
            )
        if start + T > ctx:
            where = f" after {start} cached positions" if start else ""
            raise ValueError(
                f"the input has {T} tokens{where}, but the model's context_length is {ctx}; "
                f"crop it to the last {ctx - start} tokens"
            )
        check_token_ids(idx, self.config.vocab_size)

    def check_targets(self, idx: torch.Tensor, targets: torch.Tensor) -> None:
        """Raise a clear error unless ``targets`` are token ids of the input's shape (B, T)."""
        if targets.shape != idx.shape:
            raise ValueError(
                f"targets must have the same shape as the input {tuple(idx.shape)}, "
                f"got {tuple(targets.shape)}"
            )
        check_token_ids(targets, self.config.vocab_size, "targets")

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Chapters 2-3: each id's row of the token table, plus positions start..start+T-1:
        (B, T) -> (B, T, C)."""
        return self.add_positions(self.token_embedding(idx.long()), start)  # (B, T, C)

    def add_positions(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Chapter 3: token vectors (B, T, C), times sqrt(d_model) if ``scale_embeddings``, plus
        the positional encoding of positions start..start+T-1, then dropout (in training)."""
        T = tokens.shape[1]
        x = tokens
        if self.config.scale_embeddings:  # keeps the tokens from drowning in the positions
            x = x * math.sqrt(self.config.d_model)
        if self.position_embedding is not None:
            pos = torch.arange(start, start + T, device=tokens.device)
            x = x + self.position_embedding(pos)  # (T, C) broadcasts over B
        elif self.config.positions == "sinusoidal":
            x = x + self.positional_encoding[start : start + T].to(x.dtype)
        return self.dropout(x)

    def rope(self, start: int, T: int) -> Rope | None:
        """RoPE's (cos, sin), each (T, hs), for positions start..start+T-1 (None without RoPE)."""
        if self.config.positions != "rope":
            return None
        return self.rope_cos[start : start + T], self.rope_sin[start : start + T]

    def hidden_states(self, idx: torch.Tensor, cache: ModelCache | None = None) -> torch.Tensor:
        """The last block's output (B, T, C) for ids (B, T), before the final LayerNorm.

        With a KV cache, ``idx`` holds only the new tokens, at positions ``cache.length...``;
        every block stores their keys and values in the cache.
        """
        start = cache.length if cache is not None else 0
        self.check_input(idx, start)
        x = self.embed(idx, start)  # (B, T, C)
        rope = self.rope(start, idx.shape[1])
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache.layer(i), rope)  # (B, T, C)
        if cache is not None:
            cache.advance(idx.shape[1])
        return x

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        cache: ModelCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) for ids (B, T), and the mean cross-entropy of the next tokens when
        ``targets`` (B, T) is given (else None). With a KV cache, ``idx`` holds only the new
        tokens (chapter 11)."""
        x = self.final_norm(self.hidden_states(idx, cache))  # (B, T, C)
        logits = self.lm_head(x)  # (B, T, V): one score per vocabulary entry
        if targets is None:
            return logits, None
        self.check_targets(idx, targets)
        V = logits.shape[-1]
        return logits, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long())

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> torch.Tensor:
        """Every block's attention weights for ``idx``: (n_blocks, B, H, T, T), by the explicit
        steps (the model is not changed; dropout follows the module's train/eval mode)."""
        self.check_input(idx)
        x = self.embed(idx)  # (B, T, C)
        rope = self.rope(0, idx.shape[1])
        maps = []
        for block in self.blocks:
            maps.append(block.attention_weights(x, rope))  # (B, H, T, T)
            x = block(x, rope=rope)
        return torch.stack(maps)

    def num_parameters(self) -> int:
        """Trainable parameters, a tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by part of the model; a tied output layer counts 0 (it reuses the input)."""

        def count(*modules: nn.Module | None) -> int:
            return sum(p.numel() for m in modules if m is not None for p in m.parameters())

        parts = {
            "token embedding": count(self.token_embedding),
            "position embedding": count(self.position_embedding),
            "attention": count(*(b.attn for b in self.blocks)),
            "feed-forward": count(*(b.ffn for b in self.blocks)),
            "layer norms": count(
                *(m for b in self.blocks for m in (b.ln1, b.ln2)), self.final_norm
            ),
            "output layer": 0 if self.config.tie_embeddings else count(self.lm_head),
        }
        assert sum(parts.values()) == self.num_parameters()
        return parts
