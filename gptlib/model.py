"""A GPT-style decoder-only transformer, one book step per piece.

Read top to bottom, this file follows the book: positional encoding, the causal mask, scaled
dot-product attention, multi-head attention (with a hand-written path for teaching and a fused
path for speed), the feed-forward network, a transformer block, and the whole model.

Shapes use B = batch, T = sequence length, C = d_model, H = heads, hs = head size (C // H),
V = vocabulary size.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass
class GPTConfig:
    """Every size and switch of the model. Defaults are the book's running example."""

    vocab_size: int = 100_070  # rows of the embedding table: largest cl100k id in the book + 1
    context_length: int = 16  # T: the most tokens the model looks at
    d_model: int = 64  # C: width of every token vector
    n_heads: int = 4  # H: attention heads; head size is d_model // n_heads
    n_blocks: int = 8  # transformer blocks stacked on top of each other
    ffn_mult: int = 4  # feed-forward hidden width = ffn_mult * d_model
    dropout: float = 0.1
    norm: Literal["pre", "post"] = "pre"  # where LayerNorm sits relative to the residual add
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    activation: Literal["relu", "gelu", "gelu_tanh"] = "relu"
    bias: bool = True  # biases in Linear and LayerNorm layers
    tie_embeddings: bool = False  # share the token embedding with the output projection
    final_norm: bool = True  # a LayerNorm after the last block (needed with pre-LN)
    layer_norm_eps: float = 1e-5
    fused_attention: bool = True  # F.scaled_dot_product_attention instead of the explicit path

    def __post_init__(self) -> None:
        problems = []
        for name in ("vocab_size", "context_length", "d_model", "n_heads", "n_blocks", "ffn_mult"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if not problems and self.d_model % self.n_heads != 0:
            problems.append(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) so that "
                f"every head gets the same size; try n_heads in "
                f"{[h for h in range(1, self.d_model + 1) if self.d_model % h == 0][:8]}"
            )
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        choices = {
            "norm": ("pre", "post"),
            "positions": ("sinusoidal", "learned"),
            "activation": ("relu", "gelu", "gelu_tanh"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.positions == "sinusoidal" and not problems and self.d_model % 2:
            problems.append(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if problems:
            raise ValueError("invalid GPTConfig: " + "; ".join(problems))

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return self.ffn_mult * self.d_model

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Step by step: positions, mask, attention
# --------------------------------------------------------------------------------------------


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


def causal_mask(T: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``(T, T)`` mask, True where query ``i`` may see key ``j`` (that is, ``j <= i``)."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


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
    shapes (..., Tq, d_v) and (..., Tq, Tk); masked weights are exactly 0.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k need the same last dimension, got {q.shape} and {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v need the same length, got {k.shape} and {v.shape}")
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # each row sums to 1
    if dropout_p > 0.0:
        keep = torch.rand(weights.shape, generator=generator, device=weights.device) >= dropout_p
        weights = weights * keep / (1.0 - dropout_p)
    return weights @ v, weights


def _causal_attention_with_dropout_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
) -> torch.Tensor:
    """Causal attention with dropout on the weights, for training on a CPU.

    ``F.scaled_dot_product_attention`` has no CPU kernel with dropout: it falls back to a generic
    path of a dozen small operations that rebuilds the mask and checks for fully masked rows on
    every call. This computes the same thing in four: scale, mask and QKᵀ in one ``baddbmm``,
    softmax, dropout, weighted sum (about 5% of a training step faster for the book's model).
    q, k, v: (B, H, T, hs) -> (B, H, T, hs).
    """
    B, H, T, hs = q.shape
    q3, k3, v3 = (t.reshape(B * H, T, hs) for t in (q, k, v))  # (B*H, T, hs) each
    above = torch.full((T, T), float("-inf"), dtype=q.dtype, device=q.device).triu(1)  # (T, T)
    scores = torch.baddbmm(above, q3, k3.transpose(1, 2), alpha=1.0 / math.sqrt(hs))  # (B*H, T, T)
    weights = F.dropout(torch.softmax(scores, dim=-1), dropout_p, training=True)
    return torch.bmm(weights, v3).view(B, H, T, hs)  # (B, H, T, hs)


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, C) -> (B, H, T, hs): give each head its own slice of the channels."""
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, hs) -> (B, T, C): concatenate the heads' outputs side by side."""
    B, H, T, hs = x.shape
    return x.transpose(1, 2).contiguous().view(B, T, H * hs)


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


# --------------------------------------------------------------------------------------------
# KV cache (used by generation)
# --------------------------------------------------------------------------------------------


class KVCache:
    """Keys and values of the tokens seen so far, kept between generation steps.

    Every block gets a pair of buffers, keys and values of shape (B, H, capacity, hs), allocated
    when the block first writes to them and doubled in size when they fill up (at most to the
    model's context length). A step writes the new tokens' keys and values *in place* after the
    cached ones, so it copies only the new positions instead of re-concatenating the whole
    history. ``length`` is how many positions are cached: the next token fed to the model gets
    position ``length``. ``max_length`` (usually the model's context length) caps the growth.
    """

    def __init__(self, max_length: int | None = None) -> None:
        self.max_length = max_length
        self._keys: list[torch.Tensor] = []  # per block: (B, H, capacity, hs)
        self._values: list[torch.Tensor] = []
        self.length = 0

    @property
    def capacity(self) -> int:
        """Positions the buffers can hold before they grow (0 before the first write)."""
        return self._keys[0].shape[-2] if self._keys else 0

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each block's cached (keys, values), views of shape (B, H, length, hs)."""
        n = self.length
        return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(self._keys, self._values, strict=True)]

    def extend(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write block ``layer``'s new keys/values (B, H, T, hs) at positions length..length+T-1
        and return all of its keys/values so far, (B, H, length + T, hs) views.

        The cache's ``length`` does not change here: the model calls :meth:`advance` once every
        block has written its share.
        """
        start, end = self.length, self.length + k.shape[-2]
        if layer > len(self._keys):
            raise ValueError(f"blocks write in order: block {layer} came before {len(self._keys)}")
        if layer == len(self._keys):  # the block's first write: empty buffers, grown below
            self._keys.append(k.new_empty(*k.shape[:2], 0, k.shape[-1]))
            self._values.append(v.new_empty(*v.shape[:2], 0, v.shape[-1]))
        keys, values = self._keys[layer], self._values[layer]
        if keys.shape[:2] != k.shape[:2]:
            raise ValueError(
                f"this cache holds (batch, heads) = {tuple(keys.shape[:2])}, got keys for "
                f"{tuple(k.shape[:2])}; use a new KVCache (or reset() it) for another batch"
            )
        if keys.shape[-2] < end:  # full: double the capacity (at least 16, at most max_length)
            capacity = max(end, 16, 2 * keys.shape[-2])
            if self.max_length is not None:
                capacity = max(end, min(capacity, self.max_length))
            keys = k.new_empty(*k.shape[:2], capacity, k.shape[-1])
            values = v.new_empty(*v.shape[:2], capacity, v.shape[-1])
            keys[:, :, :start] = self._keys[layer][:, :, :start]  # keep what is cached
            values[:, :, :start] = self._values[layer][:, :, :start]
            self._keys[layer], self._values[layer] = keys, values
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def advance(self, T: int) -> None:
        """Count ``T`` more cached positions (after every block has called :meth:`extend`)."""
        self.length += T

    def reset(self) -> None:
        """Forget everything: the next token gets position 0 (the buffers are released)."""
        self._keys.clear()
        self._values.clear()
        self.length = 0


# --------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Masked multi-head self-attention with visible Wq, Wk, Wv and Wo.

    Two paths compute the same thing: ``explicit`` (the book's steps, and the attention weights
    for plots) and ``fused`` (``F.scaled_dot_product_attention``, faster).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        fused: bool = True,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.head_size = d_model // n_heads
        self.dropout = dropout
        self.fused = fused
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, d_model, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        return_weights: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """Attend over ``x`` (B, T, C), after earlier tokens' keys and values if given.

        The earlier keys and values come either as ``past``, a (k, v) pair that is concatenated
        with the new ones, or from block ``layer`` of a :class:`KVCache`, which stores the new
        ones in place. Returns ``(out, (k, v), weights)``: out is (B, T, C); (k, v) are all keys
        and values, earlier and new, (B, H, T_past + T, hs); weights (B, H, T, T_past + T) come
        from the explicit path (``return_weights`` forces it); the fused path returns None.
        """
        if x.dim() != 3 or x.shape[-1] != self.n_heads * self.head_size:
            raise ValueError(
                f"expected input of shape (B, T, {self.n_heads * self.head_size}), "
                f"got {tuple(x.shape)}"
            )
        if past is not None and cache is not None:
            raise ValueError("give the earlier keys and values as past or as cache, not both")
        T = x.shape[1]
        q = split_heads(self.W_q(x), self.n_heads)  # (B, H, T, hs)
        k = split_heads(self.W_k(x), self.n_heads)  # (B, H, T, hs)
        v = split_heads(self.W_v(x), self.n_heads)  # (B, H, T, hs)
        if past is not None:
            k = torch.cat([past[0], k], dim=-2)  # (B, H, T_past + T, hs)
            v = torch.cat([past[1], v], dim=-2)
        elif cache is not None:
            k, v = cache.extend(layer, k, v)  # (B, H, T_past + T, hs) each
        T_all = k.shape[-2]
        fused = self.fused and not return_weights
        causal = T > 1 and T == T_all  # no earlier tokens: the plain causal mask
        # query i sits at absolute position T_all - T + i and may see keys 0..that position; a
        # single new query sees every key, and the fused path knows the plain causal mask itself
        mask = None
        if T > 1 and not (fused and causal):
            mask = torch.ones(T, T_all, dtype=torch.bool, device=x.device).tril(T_all - T)
        p = self.dropout if self.training else 0.0
        weights = None
        if fused and p > 0.0 and causal and x.device.type == "cpu":
            out = _causal_attention_with_dropout_cpu(q, k, v, p)
        elif fused:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal
            )
        else:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)
        out = self.resid_dropout(self.W_o(merge_heads(out)))  # (B, T, C)
        return out, (k, v), weights


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
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        if activation == "relu":
            self.activation: nn.Module = nn.ReLU()
        elif activation == "gelu":
            self.activation = nn.GELU()
        elif activation == "gelu_tanh":
            self.activation = nn.GELU(approximate="tanh")
        else:
            raise ValueError(f"activation must be relu, gelu or gelu_tanh, got {activation!r}")
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear2(self.activation(self.linear1(x))))  # (B, T, C)


class TransformerBlock(nn.Module):
    """Attention then feed-forward, each wrapped in a residual connection and a LayerNorm.

    ``norm="post"`` (the 2017 paper): x = LN(x + sublayer(x)).
    ``norm="pre"`` (GPT-2 and most code): x = x + sublayer(LN(x)).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        c = config
        self.norm = c.norm
        self.ln1 = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout, c.bias, c.fused_attention)
        self.ln2 = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, c.dropout, c.bias)

    def forward(
        self,
        x: torch.Tensor,
        *,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
        return_weights: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """x: (B, T, C) -> (B, T, C); also the block's keys/values and (optionally) weights.

        ``past``, ``cache`` and ``layer`` go to the attention (see :class:`MultiHeadAttention`).
        """
        kw = {"past": past, "cache": cache, "layer": layer, "return_weights": return_weights}
        if self.norm == "pre":
            a, kv, w = self.attn(self.ln1(x), **kw)
            x = x + a
            x = x + self.ffn(self.ln2(x))
        else:
            a, kv, w = self.attn(x, **kw)
            x = self.ln1(x + a)
            x = self.ln2(x + self.ffn(x))
        return x, kv, w


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V), and the loss when targets are given."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model)
        if c.positions == "learned":
            self.position_embedding: nn.Embedding | None = nn.Embedding(c.context_length, c.d_model)
        else:
            self.position_embedding = None
            pe = sinusoidal_positional_encoding(c.context_length, c.d_model)
            self.register_buffer("positional_encoding", pe, persistent=False)
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(c) for _ in range(c.n_blocks))
        self.final_norm = (
            nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
            if c.final_norm
            else nn.Identity()
        )
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's initialisation: small normal weights, zero biases
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # ---- checks with clear messages --------------------------------------------------------

    def _check_input(self, idx: torch.Tensor, start: int = 0) -> None:
        c = self.config
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
            shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise ValueError(f"expected token ids of shape (batch, time), got {shape}")
        if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise TypeError(f"token ids must be an integer tensor, got {idx.dtype}")
        T = idx.shape[1]
        if T == 0:
            raise ValueError("the input is empty: give at least one token")
        if start + T > c.context_length:
            where = f" after {start} cached positions" if start else ""
            raise ValueError(
                f"the input has {T} tokens{where}, but the model's context_length is "
                f"{c.context_length}; crop it to the last {c.context_length - start} tokens"
            )
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= c.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"token id {bad} is outside the vocabulary (valid ids are 0..{c.vocab_size - 1}); "
                "encode the text with the same tokenizer/vocabulary the model was built for"
            )

    # ---- forward ---------------------------------------------------------------------------

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Token embedding + positional encoding for positions start..start+T-1: (B, T, C)."""
        T = idx.shape[1]
        x = self.token_embedding(idx.long())  # (B, T, C); nn.Embedding takes int64/int32 only
        if self.position_embedding is not None:
            pos = torch.arange(start, start + T, device=idx.device)
            x = x + self.position_embedding(pos)  # (T, C) broadcasts over B
        else:
            x = x + self.positional_encoding[start : start + T].to(x.dtype)
        return self.dropout(x)

    def hidden_states(self, idx: torch.Tensor, *, cache: KVCache | None = None) -> torch.Tensor:
        """The last block's output (B, T, C) for ids (B, T), before the final LayerNorm.

        With a :class:`KVCache`, ``idx`` holds only the new tokens, at positions
        ``cache.length...``; every block stores their keys and values in the cache.
        """
        start = cache.length if cache is not None else 0
        self._check_input(idx, start)
        x = self.embed(idx, start)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x, _, _ = block(x, cache=cache, layer=i)  # (B, T, C)
        if cache is not None:
            cache.advance(idx.shape[1])
        return x

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) for ids (B, T); the mean cross-entropy when ``targets`` (B, T) is given.

        With a :class:`KVCache`, ``idx`` holds only the new tokens; the cache is extended in place.
        """
        x = self.hidden_states(idx, cache=cache)  # (B, T, C)
        x = self.final_norm(x)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            if targets.shape != idx.shape:
                raise ValueError(
                    f"targets must have the same shape as the input {tuple(idx.shape)}, "
                    f"got {tuple(targets.shape)}"
                )
            if targets.dtype.is_floating_point or targets.dtype.is_complex:
                raise TypeError(f"targets must be integer token ids, got {targets.dtype}")
            # cross_entropy needs int64 class indices
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long())
        return logits, loss

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> torch.Tensor:
        """Every block's attention weights for ``idx``: (n_blocks, B, H, T, T), via the explicit
        path (the model is not changed; dropout follows the module's train/eval mode)."""
        self._check_input(idx)
        x = self.embed(idx)
        maps = []
        for block in self.blocks:
            x, _, w = block(x, return_weights=True)
            maps.append(w)
        return torch.stack(maps)

    @classmethod
    def from_pretrained(cls, name_or_dir: str = "gpt2", **kwargs) -> GPT:
        """GPT-2 weights from Hugging Face as a gptlib model (see :func:`gptlib.hf.from_pretrained`;
        needs the optional ``transformers`` dependency)."""
        from gptlib.hf import from_pretrained

        return from_pretrained(name_or_dir, **kwargs)

    # ---- sizes -----------------------------------------------------------------------------

    def num_parameters(self) -> int:
        """Trainable parameters, a tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by part of the model; a tied output layer counts 0 (it reuses the input)."""

        def count(m: nn.Module | None) -> int:
            return 0 if m is None else sum(p.numel() for p in m.parameters())

        parts = {
            "token embedding": count(self.token_embedding),
            "position embedding": count(self.position_embedding),
            "attention": sum(count(b.attn) for b in self.blocks),
            "feed-forward": sum(count(b.ffn) for b in self.blocks),
            "layer norms": sum(count(b.ln1) + count(b.ln2) for b in self.blocks)
            + count(self.final_norm),
            "output layer": 0 if self.config.tie_embeddings else count(self.lm_head),
        }
        assert sum(parts.values()) == self.num_parameters()
        return parts
