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
    ("embed", "token\nembedding"),
    ("position", "× √d_model\n+ positions"),  # chapter 3 scales the embeddings, then adds
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
    ("final_norm", "final\nLayerNorm"),
    ("logits", "output\nlayer"),
)
PIPELINE_KEYS: tuple[str, ...] = tuple(dict.fromkeys(k for k, _ in PIPELINE_STEPS))


# The diagram's layout: the steps outside the blocks form the top row, with one box standing for
# the n_blocks transformer blocks; the row below zooms into one block. Two rows keep every label
# at a readable size on a page as wide as the book's.
_OUTER = ("tokenize", "embed", "position", None, "final_norm", "logits")  # None: the block box
_BLOCK_SLOTS = len(PIPELINE_STEPS) - (len(_OUTER) - 1)  # the boxes of one block, 12
_TOP, _BOTTOM, _GAP = 2.45, 0.0, 0.14  # each row's lower edge; the space between two boxes
_FONT = 10.0


def _box(
    ax: Axes, x: float, y: float, w: float, h: float, label: str, on: bool, bold: bool = False
) -> None:
    """One box at (x, y), w x h data units, with its label; highlighted boxes are orange, and
    their label bold (as is a plain box's when ``bold``). Each label is shrunk, if needed, to fit
    inside its box."""
    face, edge = ("#f28e2b", "#b35806") if on else ("#e8eef7", "#8da0cb")
    ax.add_patch(plt.Rectangle((x, y), w, h, facecolor=face, edgecolor=edge, lw=2 if on else 1))
    weight = "bold" if on or bold else "normal"
    text = ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=_FONT)
    text.set_fontweight(weight)
    _fit_inside(text, 0.92 * w, 0.92 * h)


def _pipeline_boxes() -> list[tuple[float, float, float, float]]:
    """(x, y, width, height) of every step of PIPELINE_STEPS, in its order: a step outside the
    blocks in the top row (two slots wide), a step inside the block in the bottom row."""
    spots, inner = [], 0
    for key, _ in PIPELINE_STEPS:
        if key in _OUTER:
            spots.append((2 * _OUTER.index(key), _TOP, 2 - _GAP, 0.8))
        else:
            spots.append((inner, _BOTTOM, 1 - _GAP, 1.0))
            inner += 1
    return spots


def _fit_inside(text: Text, width: float, height: float, smallest: float = 5.0) -> None:
    """Shrink ``text``'s font until it fits ``width`` x ``height`` data units (bold text is
    wider than normal text, so a highlighted label may need a smaller size than a plain one)."""
    to_data = text.axes.transData.inverted()
    while text.get_fontsize() > smallest:
        box = text.get_window_extent().transformed(to_data)  # measured by the figure's renderer
        if box.width <= width and box.height <= height:
            return
        text.set_fontsize(text.get_fontsize() - 0.5)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], **style) -> None:
    ax.annotate("", end, start, arrowprops={"arrowstyle": "->", "lw": 0.8, **style})


def _bracket(ax: Axes, a: float, b: float, y: float, text: str) -> None:
    ax.plot([a, a, b, b], [y - 0.08, y, y, y - 0.08], color="dimgrey", lw=1)
    ax.text((a + b) / 2, y + 0.05, text, ha="center", va="bottom", fontsize=9, color="dimgrey")


def _skip(ax: Axes, a: float, b: float) -> None:
    """A residual (skip) line under the bottom row, from before box a into the "+" box b."""
    x0, x1 = a - _GAP / 2, b + (1 - _GAP) / 2
    ax.plot([x0, x0, x1], [0.5, -0.3, -0.3], color="#b35806", lw=1)
    _arrow(ax, (x1, -0.3), (x1, 0), color="#b35806", lw=1)


def _block_zoom(ax: Axes, on: bool) -> None:
    """The top row's block box, and dashed lines from it down to the block drawn in full."""
    x = 2 * _OUTER.index(None)
    label = "transformer block,\nrepeated N times"
    _box(ax, x, _TOP, 2 - _GAP, 0.8, label, on=False, bold=on)  # bold: a step inside is on
    for top, bottom in ((x, -0.15), (x + 2 - _GAP, _BLOCK_SLOTS - _GAP + 0.05)):
        ax.plot([top, bottom], [_TOP, 1.75], color="grey", lw=0.8, ls="--")
    ax.add_patch(
        plt.Rectangle(
            (-0.15, -0.45), _BLOCK_SLOTS - _GAP + 0.2, 2.2, fill=False, ec="grey", ls="--"
        )
    )


def pipeline_diagram(
    highlight: str | Sequence[str] = (), ax: Axes | None = None, title: str | None = None
) -> Axes:
    """The whole (pre-LN) model, with the chapter's step(s) highlighted. The top row is the
    model from text to output; its block box stands for the n_blocks transformer blocks, and the
    row below shows what one block does.

    ``highlight`` takes one key or a list of keys: ``"tokenize"`` (chapter 1), ``"embed"``
    (token embedding, 2), ``"position"`` (positional encoding, 3), ``"layernorm"`` (the two
    LayerNorms inside each block, 4 and 8), ``"qkv"`` (W_q, W_k, W_v and the split into heads,
    4), ``"scores"`` and ``"scale"`` (5), ``"mask"`` and ``"softmax"`` (6), ``"weighted_values"``
    (the weighted sum of the values) and ``"concat_wo"`` (concatenation and W_o, 7),
    ``"residual"`` (the two residual adds) and ``"ffn"`` (feed-forward, 8), ``"final_norm"`` (the
    LayerNorm after the last block) and ``"logits"`` (the output layer and softmax, 9).
    A bracket marks the attention steps; orange lines under the boxes are the residual
    connections.
    """
    wanted = [highlight] if isinstance(highlight, str) else list(highlight)
    unknown = [k for k in wanted if k not in PIPELINE_KEYS]
    if unknown:
        raise ValueError(f"unknown pipeline step(s) {unknown}; choose from {list(PIPELINE_KEYS)}")
    keys = [k for k, _ in PIPELINE_STEPS]
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 3.5))
        fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.9 if title else 0.99)
    ax.set_xlim(-0.2, _BLOCK_SLOTS + 0.05)  # before the boxes: fitting labels needs the scale
    ax.set_ylim(-0.5, _TOP + 0.85)
    for (key, label), (x, y, w, h) in zip(PIPELINE_STEPS, _pipeline_boxes(), strict=True):
        _box(ax, x, y, w, h, label, key in wanted)
    for j in range(len(_OUTER) - 1):  # the top row, the block box included
        _arrow(ax, (2 * j + 2 - _GAP, _TOP + 0.4), (2 * j + 2, _TOP + 0.4))
    for i in range(_BLOCK_SLOTS - 1):  # the bottom row
        _arrow(ax, (i + 1 - _GAP, 0.5), (i + 1, 0.5))
    inner = [k for k in keys if k not in _OUTER]
    first_ln, adds = inner.index("layernorm"), [i for i, k in enumerate(inner) if k == "residual"]
    _skip(ax, first_ln, adds[0])
    _skip(ax, adds[0] + 1, adds[1])
    _bracket(
        ax,
        inner.index("qkv"),
        inner.index("concat_wo") + 1 - _GAP,
        1.2,
        "masked multi-head attention",
    )
    ax.text(_BLOCK_SLOTS - _GAP, 1.5, "one block (pre-LN)", ha="right", fontsize=9, color="dimgrey")
    _block_zoom(ax, any(k in wanted for k in inner))
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11)
    return ax
