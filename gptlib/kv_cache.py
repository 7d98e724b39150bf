"""The KV cache of generation (chapter 11): keys and values kept between steps.

Without a cache every generation step runs the whole window again, although the keys and values
of the earlier tokens are the same as in the previous step (causal attention: a token never looks
at later ones). With a :class:`KVCache` the model keeps them and each step only feeds the one new
token, at position ``cache.length``. The model knows nothing of this class: it asks the cache for
one view per block (``cache.layer(i)``), whose ``update(k, v)`` stores the new keys and values and
returns all of them so far.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of the tokens seen so far, kept between generation steps (chapter 11).

    Every block gets a pair of buffers, keys and values of shape (B, H, capacity, hs), allocated
    when the block first writes to them and doubled in size when they fill up (at most to
    ``max_length``, usually the model's context length). A step writes the new tokens' keys and
    values *in place* after the cached ones, so it copies only the new positions instead of
    re-concatenating the whole history. ``length`` is how many positions are cached: the next
    token fed to the model gets position ``length``.
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

    def layer(self, i: int) -> _LayerView:
        """Block ``i``'s view of the cache, the object its attention layer calls ``update`` on."""
        return _LayerView(self, i)

    def extend(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write block ``layer``'s new keys/values (B, H, T, hs) at positions length..length+T-1
        and return all of its keys/values so far, (B, H, length + T, hs) views.

        ``length`` does not change here: the model calls :meth:`advance` once every block has
        written its share.
        """
        if layer > len(self._keys):
            raise ValueError(f"blocks write in order: block {layer} came before {len(self._keys)}")
        if layer == len(self._keys):  # the block's first write: empty buffers, grown below
            self._keys.append(k.new_empty(*k.shape[:2], 0, k.shape[-1]))
            self._values.append(v.new_empty(*v.shape[:2], 0, v.shape[-1]))
        if self._keys[layer].shape[:2] != k.shape[:2]:
            raise ValueError(
                f"this cache holds (batch, heads) = {tuple(self._keys[layer].shape[:2])}, got "
                f"keys for {tuple(k.shape[:2])}; use a new KVCache (or reset() it) for another "
                "batch"
            )
        start, end = self.length, self.length + k.shape[-2]
        if self._keys[layer].shape[-2] < end:
            self._grow(layer, end)
        keys, values = self._keys[layer], self._values[layer]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def _grow(self, layer: int, end: int) -> None:
        """Double block ``layer``'s buffers (at least to ``end`` and 16, at most max_length)."""
        old_k, old_v = self._keys[layer], self._values[layer]
        capacity = max(end, 16, 2 * old_k.shape[-2])
        if self.max_length is not None:
            capacity = max(end, min(capacity, self.max_length))
        keys = old_k.new_empty(*old_k.shape[:2], capacity, old_k.shape[-1])
        values = old_v.new_empty(*old_v.shape[:2], capacity, old_v.shape[-1])
        keys[:, :, : self.length] = old_k[:, :, : self.length]  # keep what is cached
        values[:, :, : self.length] = old_v[:, :, : self.length]
        self._keys[layer], self._values[layer] = keys, values

    def advance(self, T: int) -> None:
        """Count ``T`` more cached positions (after every block has called :meth:`extend`)."""
        self.length += T

    def reset(self) -> None:
        """Forget everything: the next token gets position 0 (the buffers are released)."""
        self._keys.clear()
        self._values.clear()
        self.length = 0


class _LayerView:
    """One block's handle on a :class:`KVCache` (what the model's attention layer sees)."""

    def __init__(self, cache: KVCache, layer: int) -> None:
        self.cache, self.index = cache, layer

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys/values (B, H, T, hs); return all of them so far (B, H, T_all, hs)."""
        return self.cache.extend(self.index, k, v)
