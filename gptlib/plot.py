"""The matplotlib figures the chapters share, so every chapter looks the same.

Colour maps: ``VALUES_CMAP`` for unsigned quantities (attention weights, probabilities) and
``SIGNED_CMAP`` for values around zero (embeddings, scores, positional encodings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text

VALUES_CMAP = "viridis"
SIGNED_CMAP = "RdBu_r"
MASK_COLOR = "#d9d9d9"


def _to_numpy(m) -> np.ndarray:
    if isinstance(m, torch.Tensor):
        return m.detach().float().cpu().numpy()
    return np.asarray(m, dtype=float)


def _annotate(ax: Axes, im, m: np.ndarray, hidden: np.ndarray, fmt: str, fontsize: float) -> None:
    """Write every visible cell's value into it, white on dark cells and black on light ones."""
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            if not hidden[i, j]:
                r, g, b, _ = im.cmap(im.norm(m[i, j]))
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                color = "white" if dark else "black"
                ax.text(
                    j,
                    i,
                    fmt.format(m[i, j]),
                    ha="center",
                    va="center",
                    fontsize=fontsize,
                    color=color,
                )


def _colour_limits(
    finite: np.ndarray, signed: bool | None, vmin: float | None, vmax: float | None
) -> tuple[bool, float | None, float | None]:
    """Decide signed/unsigned and, for signed values, a colour scale symmetric around 0."""
    if signed is None:
        signed = bool((finite < 0).any())
    if signed and vmin is None and vmax is None:
        lim = float(np.abs(finite).max()) or 1.0
        vmin, vmax = -lim, lim
    return signed, vmin, vmax


def heatmap(
    matrix,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    *,
    mask=None,
    ax: Axes | None = None,
    title: str | None = None,
    cmap: str | None = None,
    signed: bool | None = None,
    colorbar: bool = True,
    annotate: bool = False,
    fmt: str = "{:.2f}",
    annotate_size: float = 6,
    xlabel: str | None = None,
    ylabel: str | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
) -> Axes:
    """A labelled heatmap of a 2-D matrix (token strings on the axes for token-by-token matrices).

    ``mask`` (boolean, same shape, True = keep) greys out the cells that are masked away, and
    non-finite cells (-inf after masking) are greyed out too. ``signed`` picks a diverging colour
    map centred on 0 (default: when the matrix has negative values). Pass the same ``vmin`` and
    ``vmax`` to panels that are compared, so that one colour means one value everywhere.
    ``annotate`` writes each visible value into its cell (``fmt``, ``annotate_size`` points):
    raise the size for small matrices drawn large, so that it stays legible on the page.
    """
    m = _to_numpy(matrix)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    hidden = ~np.isfinite(m)
    if mask is not None:
        hidden |= ~_to_numpy(mask).astype(bool)
    shown = np.ma.masked_array(np.where(np.isfinite(m), m, 0.0), mask=hidden)
    finite = m[~hidden] if (~hidden).any() else np.zeros(1)
    signed, vmin, vmax = _colour_limits(finite, signed, vmin, vmax)
    # with_extremes returns a copy (Colormap.set_bad is being deprecated in matplotlib 3.11)
    cm = plt.get_cmap(cmap or (SIGNED_CMAP if signed else VALUES_CMAP)).with_extremes(
        bad=MASK_COLOR
    )
    if ax is None:
        size = (max(4.0, 0.32 * m.shape[1] + 2), max(3.0, 0.3 * m.shape[0] + 1.5))
        _, ax = plt.subplots(figsize=size)
    im = ax.imshow(shown, cmap=cm, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    if row_labels is not None:
        ax.set_yticks(range(len(row_labels)), labels=list(row_labels), fontsize=8)
    if col_labels is not None:
        ax.set_xticks(range(len(col_labels)), labels=list(col_labels), fontsize=8, rotation=90)
    if annotate:
        _annotate(ax, im, m, hidden, fmt, annotate_size)
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    return ax


def positional_encoding_heatmap(pe, ax: Axes | None = None, title: str | None = None) -> Axes:
    """A positional-encoding table (positions down, dimensions across)."""
    pe = _to_numpy(pe)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, max(2.5, min(6.0, 0.15 * pe.shape[0] + 1.5))))
    im = ax.imshow(pe, cmap=SIGNED_CMAP, vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    for axis in (ax.xaxis, ax.yaxis):  # positions and dimensions are whole numbers
        axis.get_major_locator().set_params(integer=True)  # the default AutoLocator's option
    ax.set_title(title or f"Sinusoidal positional encoding ({pe.shape[0]} × {pe.shape[1]})")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    return ax


def attention_grid(
    weights,
    tokens: Sequence[str] | None = None,
    *,
    row_titles: Sequence[str] | None = None,
    col_titles: Sequence[str] | None = None,
    title: str | None = None,
    cell_size: float = 3.0,
    label_size: float = 8,
) -> Figure:
    """A grid of attention maps: ``weights`` (H, T, T) gives one row of heads; (L, H, T, T) gives
    one row per layer. Masked (zero, future) cells are greyed out above the diagonal. All panels
    share one colour scale (0 to 1). Token labels (``label_size`` points) are drawn for T <= 24."""
    w = _to_numpy(weights)
    if w.ndim == 3:
        w = w[None]
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"expected weights of shape (H, T, T) or (L, H, T, T), got {w.shape}")
    L, H, T, _ = w.shape
    fig, axes = plt.subplots(
        L, H, figsize=(cell_size * H + 1, cell_size * L + 0.6), squeeze=False, sharex=True
    )
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    cm = plt.get_cmap(VALUES_CMAP).with_extremes(bad=MASK_COLOR)
    im = None
    for layer in range(L):
        for h in range(H):
            ax = axes[layer, h]
            im = ax.imshow(
                np.ma.masked_array(w[layer, h], mask=future),
                cmap=cm,
                vmin=0,
                vmax=1,
                interpolation="nearest",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(col_titles[h] if col_titles else f"head {h}", fontsize=9)
            if h == 0:
                ax.set_ylabel(row_titles[layer] if row_titles else f"block {layer}", fontsize=9)
    if tokens is not None and T <= 24:
        for h in range(H):
            axes[-1, h].set_xticks(range(T), labels=list(tokens), rotation=90, fontsize=label_size)
        for layer in range(L):
            axes[layer, 0].set_yticks(range(T), labels=list(tokens), fontsize=label_size)
    if title:
        fig.suptitle(title)
    fig.colorbar(im, ax=axes, fraction=0.02, pad=0.02, label="attention weight")
    return fig


def loss_curves(
    history: Mapping[str, Sequence[float]] | Sequence[Mapping[str, float]],
    ax: Axes | None = None,
    *,
    title: str = "Training and validation loss",
    baselines: Mapping[str, float] | None = None,
) -> Axes:
    """Train/validation loss against step.

    ``history`` is either a dict of lists (``step``, ``train_loss``, ``val_loss``) or a list of
    per-evaluation dicts with those keys. ``baselines`` draws labelled horizontal lines (e.g. the
    loss of guessing uniformly, ln V, or of a unigram model).
    """
    if isinstance(history, Mapping):
        cols = {k: list(v) for k, v in history.items()}
    else:
        rows = list(history)
        cols = {k: [r.get(k) for r in rows] for k in (rows[0].keys() if rows else ())}
    if "step" not in cols:
        raise ValueError("history needs a 'step' column")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("train_loss", "train"), ("val_loss", "validation")):
        if key in cols:
            pts = [(s, v) for s, v in zip(cols["step"], cols[key], strict=False) if v is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", markersize=3, label=label)
    for name, value in (baselines or {}).items():
        ax.axhline(value, linestyle="--", linewidth=1, color="grey")
        ax.annotate(
            f"{name} ({value:.2f})",
            (0, value),
            xycoords=("axes fraction", "data"),
            xytext=(4, 3),
            textcoords="offset points",
            fontsize=8,
            color="dimgrey",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


# The book's pipeline, in order: (key, box label). The model is pre-LN: inside each block a
# LayerNorm comes *before* attention and before the feed-forward network, each sublayer's output is
# added back onto the residual stream, and a final LayerNorm follows the last block. The keys
# "layernorm" and "residual" name two boxes each (one per sublayer).
PIPELINE_STEPS: tuple[tuple[str, str], ...] = (
    ("tokenize", "text →\ntoken ids"),
    ("embed", "token\nembedding\n× √d_model"),
    ("position", "+ positions"),
    ("layernorm", "Layer-\nNorm"),
    ("qkv", "Q, K, V\n& heads"),
    ("scores", "Q·Kᵀ"),
    ("scale", "÷ √d_k"),
    ("mask", "causal\nmask"),
    ("softmax", "softmax"),
    ("weighted_values", "weights\n· V"),
    ("concat_wo", "concat\n& W_o"),
    ("residual", "+\nresidual"),
    ("layernorm", "Layer-\nNorm"),
    ("ffn", "feed-\nforward"),
    ("residual", "+\nresidual"),
    ("final_norm", "final\nLayer-\nNorm"),
    ("logits", "output\nlayer"),
)
PIPELINE_KEYS: tuple[str, ...] = tuple(dict.fromkeys(k for k, _ in PIPELINE_STEPS))


def _pipeline_box(ax: Axes, i: int, label: str, on: bool, w: float) -> None:
    """One box of the pipeline diagram at x = i; highlighted boxes are orange and bold."""
    face, edge = ("#f28e2b", "#b35806") if on else ("#e8eef7", "#8da0cb")
    ax.add_patch(plt.Rectangle((i, 0), w, 1, facecolor=face, edgecolor=edge, lw=2 if on else 1))
    weight = "bold" if on else "normal"
    text = ax.text(i + w / 2, 0.5, label, ha="center", va="center", fontsize=8, fontweight=weight)
    _fit_inside(text, 0.9 * w, 0.9)


def _fit_inside(text: Text, width: float, height: float, smallest: float = 5.0) -> None:
    """Shrink ``text``'s font until it fits ``width`` x ``height`` data units (bold text is
    wider than normal text, so a highlighted label may need a smaller size than a plain one)."""
    to_data = text.axes.transData.inverted()
    while text.get_fontsize() > smallest:
        box = text.get_window_extent().transformed(to_data)  # measured by the figure's renderer
        if box.width <= width and box.height <= height:
            return
        text.set_fontsize(text.get_fontsize() - 0.5)


def _bracket(ax: Axes, a: float, b: float, y: float, text: str) -> None:
    ax.plot([a, a, b, b], [y - 0.08, y, y, y - 0.08], color="dimgrey", lw=1)
    ax.text((a + b) / 2, y + 0.05, text, ha="center", va="bottom", fontsize=8, color="dimgrey")


def _skip(ax: Axes, a: float, b: float, w: float) -> None:
    """A residual (skip) line under the boxes, from before box a into the "+" box b."""
    x0, x1 = a - (1 - w) / 2, b + w / 2
    ax.plot([x0, x0, x1], [0.5, -0.3, -0.3], color="#b35806", lw=1)
    ax.annotate("", (x1, 0), (x1, -0.3), arrowprops={"arrowstyle": "->", "color": "#b35806"})


def pipeline_diagram(
    highlight: str | Sequence[str] = (), ax: Axes | None = None, title: str | None = None
) -> Axes:
    """The whole (pre-LN) model as a row of boxes, with the chapter's step(s) highlighted.

    ``highlight`` takes one key or a list of keys: ``"tokenize"`` (chapter 1), ``"embed"``
    (token embedding, 2), ``"position"`` (positional encoding, 3), ``"layernorm"`` (the two
    LayerNorms inside each block, 4 and 8), ``"qkv"`` (W_q, W_k, W_v and the split into heads,
    4), ``"scores"`` and ``"scale"`` (5), ``"mask"`` and ``"softmax"`` (6), ``"weighted_values"``
    (the weighted sum of the values) and ``"concat_wo"`` (concatenation and W_o, 7),
    ``"residual"`` (the two residual adds) and ``"ffn"`` (feed-forward, 8), ``"final_norm"`` (the
    LayerNorm after the last block) and ``"logits"`` (the output layer and softmax, 9).
    Brackets mark the attention steps and the transformer block; orange lines under the boxes
    are the residual connections. Each label is shrunk, if needed, to fit inside its box.
    """
    wanted = [highlight] if isinstance(highlight, str) else list(highlight)
    unknown = [k for k in wanted if k not in PIPELINE_KEYS]
    if unknown:
        raise ValueError(f"unknown pipeline step(s) {unknown}; choose from {list(PIPELINE_KEYS)}")
    keys = [k for k, _ in PIPELINE_STEPS]
    n, w = len(PIPELINE_STEPS), 0.86
    if ax is None:
        fig, ax = plt.subplots(figsize=(15, 2.6))
        fig.subplots_adjust(left=0.01, right=0.99)  # the boxes get the whole width
    ax.set_xlim(-0.1, n + 0.14)  # before the boxes: fitting their labels needs the final scale
    ax.set_ylim(-0.45, 2.05)
    for i, (key, label) in enumerate(PIPELINE_STEPS):
        _pipeline_box(ax, i, label, key in wanted, w)
        if i < n - 1:
            ax.annotate("", (i + 1, 0.5), (i + w, 0.5), arrowprops={"arrowstyle": "->", "lw": 0.8})
    first_ln, adds = keys.index("layernorm"), [i for i, k in enumerate(keys) if k == "residual"]
    _skip(ax, first_ln, adds[0], w)
    _skip(ax, adds[0] + 1, adds[1], w)
    _bracket(ax, keys.index("qkv"), keys.index("concat_wo") + w, 1.2, "masked multi-head attention")
    _bracket(
        ax, first_ln, adds[-1] + w, 1.62, "transformer block, pre-LN (repeated n_blocks times)"
    )
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    return ax
