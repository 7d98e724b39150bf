"""The shared figures: titles, labels, colour maps, masked cells, grids and the pipeline diagram.

Drawn with the non-interactive Agg backend; every figure is closed after each test.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text

from gptlib.config import GPTConfig
from gptlib.model import causal_mask, sinusoidal_positional_encoding
from gptlib.plot import (
    MASK_COLOR,
    PIPELINE_KEYS,
    PIPELINE_STEPS,
    SIGNED_CMAP,
    VALUES_CMAP,
    attention_grid,
    heatmap,
    loss_curves,
    pipeline_diagram,
    positional_encoding_heatmap,
)


@pytest.fixture(autouse=True)
def agg_and_close():
    previous = plt.get_backend()
    plt.switch_backend("Agg")
    yield
    plt.close("all")
    plt.switch_backend(previous)


def image_axes(fig: Figure) -> list[Axes]:
    return [ax for ax in fig.axes if ax.images]


def tick_texts(labels) -> list[str]:
    return [t.get_text() for t in labels]


# ---- heatmap -------------------------------------------------------------------------------


def test_heatmap_labels_title_and_values():
    m = torch.rand(3, 4)
    ax = heatmap(m, ["a", "b", "c"], ["w", "x", "y", "z"], title="T", xlabel="key", ylabel="query")
    assert isinstance(ax, Axes)
    assert ax.get_title() == "T" and ax.get_xlabel() == "key" and ax.get_ylabel() == "query"
    assert tick_texts(ax.get_yticklabels()) == ["a", "b", "c"]
    assert tick_texts(ax.get_xticklabels()) == ["w", "x", "y", "z"]
    (image,) = ax.images
    np.testing.assert_allclose(image.get_array().filled(np.nan), m.numpy(), rtol=1e-6)
    assert image.get_cmap().name == VALUES_CMAP  # non-negative values: sequential colour map
    assert len(ax.figure.axes) == 2  # the heatmap and its colour bar


def test_heatmap_mask_greys_masked_cells():
    T = 5
    scores = torch.randn(T, T)
    mask = causal_mask(T)
    ax = heatmap(scores, mask=mask, colorbar=False)
    shown = ax.images[0].get_array()
    assert np.ma.isMaskedArray(shown)
    np.testing.assert_array_equal(np.ma.getmaskarray(shown), ~mask.numpy())
    assert ax.images[0].get_cmap().get_bad() == pytest.approx(to_rgba(MASK_COLOR))
    assert len(ax.figure.axes) == 1  # no colour bar


def test_heatmap_greys_minus_infinity_and_centres_signed_values():
    scores = torch.tensor([[1.0, float("-inf")], [-3.0, 2.0]])
    ax = heatmap(scores)
    image = ax.images[0]
    np.testing.assert_array_equal(np.ma.getmaskarray(image.get_array()), [[0, 1], [0, 0]])
    assert image.get_cmap().name == SIGNED_CMAP
    assert image.get_clim() == (-3.0, 3.0)  # symmetric around 0: white means zero


def test_heatmap_annotations_and_explicit_axes():
    fig, ax = plt.subplots()
    m = np.array([[0.25, 0.5], [0.75, 1.0]])
    out = heatmap(m, ax=ax, annotate=True, fmt="{:.1f}", mask=np.array([[1, 0], [1, 1]]))
    assert out is ax
    assert sorted(t.get_text() for t in ax.texts) == ["0.2", "0.8", "1.0"]  # masked cell skipped
    assert {t.get_fontsize() for t in ax.texts} == {6}  # the default, for large matrices


def test_heatmap_annotation_size_can_be_raised():
    fig, ax = plt.subplots()
    heatmap(np.eye(3), ax=ax, annotate=True, annotate_size=11)
    assert len(ax.texts) == 9 and {t.get_fontsize() for t in ax.texts} == {11}


def test_heatmap_needs_a_matrix():
    with pytest.raises(ValueError, match=r"heatmap needs a 2-D matrix, got shape \(2, 2, 2\)"):
        heatmap(np.zeros((2, 2, 2)))


def test_positional_encoding_heatmap():
    pe = sinusoidal_positional_encoding(16, 32)
    ax = positional_encoding_heatmap(pe)
    assert ax.get_title() == "Sinusoidal positional encoding (16 × 32)"
    assert ax.get_xlabel() == "dimension" and ax.get_ylabel() == "position"
    (image,) = ax.images
    assert image.get_array().shape == (16, 32) and image.get_clim() == (-1.0, 1.0)
    assert image.get_cmap().name == SIGNED_CMAP
    ticks = [*ax.get_xticks(), *ax.get_yticks()]
    assert all(float(t).is_integer() for t in ticks)  # no position 2.5
    assert positional_encoding_heatmap(pe, title="PE").get_title() == "PE"


# ---- attention grid ------------------------------------------------------------------------


@pytest.mark.parametrize(("L", "H", "T"), [(1, 1, 3), (2, 4, 6), (3, 2, 5)])
def test_attention_grid_has_one_image_per_layer_and_head(L, H, T):
    w = torch.softmax(torch.randn(L, H, T, T).masked_fill(~causal_mask(T), float("-inf")), -1)
    fig = attention_grid(w, tokens=[f"t{i}" for i in range(T)], title="maps")
    assert isinstance(fig, Figure)
    axes = image_axes(fig)
    assert len(axes) == L * H
    assert fig.get_suptitle() == "maps"
    assert [ax.get_title() for ax in axes[:H]] == [f"head {h}" for h in range(H)]
    assert [axes[layer * H].get_ylabel() for layer in range(L)] == [
        f"block {layer}" for layer in range(L)
    ]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    for ax in axes:  # the future cells are greyed out
        np.testing.assert_array_equal(np.ma.getmaskarray(ax.images[0].get_array()), future)
    assert tick_texts(axes[-1].get_xticklabels()) == [f"t{i}" for i in range(T)]
    assert tick_texts(axes[0].get_yticklabels()) == [f"t{i}" for i in range(T)]


def test_attention_grid_of_one_layer_and_custom_titles():
    w = torch.softmax(torch.randn(3, 4, 4), -1)
    fig = attention_grid(w, row_titles=["layer A"], col_titles=["x", "y", "z"])
    axes = image_axes(fig)
    assert len(axes) == 3
    assert [ax.get_title() for ax in axes] == ["x", "y", "z"]
    assert axes[0].get_ylabel() == "layer A"


def test_attention_grid_rejects_bad_shapes():
    message = r"expected weights of shape \(H, T, T\) or \(L, H, T, T\)"
    with pytest.raises(ValueError, match=message):
        attention_grid(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"got \(4, 4\)"):
        attention_grid(np.zeros((4, 4)))


# ---- loss curves ---------------------------------------------------------------------------


def test_loss_curves_from_columns_with_baselines():
    history = {"step": [0, 10, 20], "train_loss": [4.0, 3.0, 2.5], "val_loss": [4.1, None, 2.9]}
    ax = loss_curves(history, baselines={"uniform": 4.16}, title="Loss")
    assert ax.get_title() == "Loss"
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "cross-entropy loss"
    lines = {line.get_label(): line for line in ax.get_lines()}
    np.testing.assert_allclose(lines["train"].get_ydata(), [4.0, 3.0, 2.5])
    np.testing.assert_allclose(lines["validation"].get_xdata(), [0, 20])  # None is skipped
    assert any(t.get_text() == "uniform (4.16)" for t in ax.texts)
    flat = [line for line in ax.get_lines() if line.get_label() not in ("train", "validation")]
    assert len(flat) == 1 and list(flat[0].get_ydata()) == [4.16, 4.16]
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["train", "validation"]


def test_loss_curves_from_rows():
    rows = [{"step": 1, "train_loss": 2.0}, {"step": 2, "train_loss": 1.5}]
    ax = loss_curves(rows)
    assert ax.get_title() == "Training and validation loss"
    assert [line.get_label() for line in ax.get_lines()] == ["train"]


def test_loss_curves_need_steps():
    with pytest.raises(ValueError, match="history needs a 'step' column"):
        loss_curves({"train_loss": [1.0]})


# ---- pipeline diagram ----------------------------------------------------------------------


def highlighted_keys(ax: Axes) -> list[str]:
    boxes = ax.patches[: len(PIPELINE_STEPS)]
    plain = pipeline_diagram().patches[0].get_facecolor()  # nothing highlighted
    return [PIPELINE_STEPS[i][0] for i, p in enumerate(boxes) if p.get_facecolor() != plain]


def test_pipeline_diagram_highlights_the_chosen_steps():
    ax = pipeline_diagram(["mask", "softmax"], title="Chapter 6")
    assert ax.get_title() == "Chapter 6"
    assert len(PIPELINE_STEPS) == 17
    assert len(ax.patches) == 17 + 2  # the steps, the box standing for the blocks, its outline
    assert highlighted_keys(ax) == ["mask", "softmax"]
    labels = [t.get_text() for t in ax.texts]
    assert "softmax" in labels and "masked multi-head attention" in labels
    assert highlighted_keys(pipeline_diagram("embed")) == ["embed"]
    # a key that names two boxes highlights both: the two LayerNorms, the two residual adds
    assert highlighted_keys(pipeline_diagram(["layernorm", "residual"])) == [
        "layernorm",
        "residual",
        "layernorm",
        "residual",
    ]
    every = pipeline_diagram(list(PIPELINE_KEYS))
    assert len(highlighted_keys(every)) == len(PIPELINE_STEPS)


def test_pipeline_diagram_marks_the_block_when_a_step_inside_it_is_highlighted():
    def block_label(ax: Axes) -> Text:
        (text,) = [t for t in ax.texts if t.get_text().startswith("transformer block")]
        return text

    assert block_label(pipeline_diagram("softmax")).get_fontweight() == "bold"
    assert block_label(pipeline_diagram("embed")).get_fontweight() == "normal"
    plt.close("all")


def test_pipeline_diagram_is_pre_ln_with_a_final_norm():
    keys = [k for k, _ in PIPELINE_STEPS]
    # inside the block: LayerNorm before attention, residual add after W_o, LayerNorm before FFN
    block = keys[keys.index("layernorm") : len(keys) - 2]
    assert block == [
        "layernorm",
        "qkv",
        "scores",
        "scale",
        "mask",
        "softmax",
        "weighted_values",
        "concat_wo",
        "residual",
        "layernorm",
        "ffn",
        "residual",
    ]
    assert keys[-2:] == ["final_norm", "logits"]  # the final LayerNorm precedes the output layer
    assert keys[:3] == ["tokenize", "embed", "position"]
    assert set(PIPELINE_KEYS) == set(keys) and len(PIPELINE_KEYS) == 15


def test_pipeline_diagram_rejects_unknown_steps():
    message = r"unknown pipeline step\(s\) \['attention'\]; choose from \['tokenize', 'embed'"
    with pytest.raises(ValueError, match=message):
        pipeline_diagram(["mask", "attention"])
    with pytest.raises(ValueError, match=r"\['add_norm'\]"):
        pipeline_diagram("add_norm")  # the old post-LN box no longer exists


def test_pipeline_diagram_labels_fit_their_boxes_even_in_bold():
    # the highlighted label is bold, hence wider; every label must stay inside its box
    for highlight in [(), list(PIPELINE_KEYS)]:
        ax = pipeline_diagram(highlight)
        to_data = ax.transData.inverted()
        boxes = ax.patches[: len(PIPELINE_STEPS)]
        labels = [t for t in ax.texts if not isinstance(t, Annotation)][: len(PIPELINE_STEPS)]
        for (key, label), box, text in zip(PIPELINE_STEPS, boxes, labels, strict=True):
            assert text.get_text() == label
            extent = text.get_window_extent().transformed(to_data)
            x0, x1 = box.get_x(), box.get_x() + box.get_width()
            assert x0 < extent.x0 and extent.x1 < x1, (key, highlight)
            assert box.get_y() < extent.y0 and extent.y1 < box.get_y() + box.get_height()
            assert text.get_fontsize() >= 8.5, (key, text.get_fontsize())
        # at most 9.5 inches wide: the site shows the figure about that wide, so a label keeps
        # (nearly) its size in points on the page
        assert ax.figure.get_figwidth() <= 9.5
        plt.close(ax.figure)


def test_pipeline_diagram_shows_the_embedding_scale():
    # the book's model multiplies token embeddings by sqrt(d_model) in chapter 3, with the
    # positions, so the factor is in chapter 3's box, not in chapter 2's
    labels = dict(PIPELINE_STEPS)
    assert "√d_model" in labels["position"] and "√d_model" not in labels["embed"]
    assert GPTConfig().scale_embeddings
