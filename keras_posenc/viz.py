"""Plotting helpers (matplotlib, Agg backend): each returns a `Figure`.

Shape letters as in docs/glossary.md: T positions, S keys, N heads, D width.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def position_similarity(encodings, title="Position similarity"):
    """Cosine similarity of every pair of position vectors `(T, D)`: `(T, T)`."""
    encodings = np.asarray(encodings, dtype=np.float64)
    if encodings.ndim != 2:
        raise ValueError(
            f"`encodings` must have shape (T, D). Received: shape={encodings.shape}"
        )
    figure, axis = plt.subplots(figsize=(4.5, 4))
    image = axis.imshow(_cosine(encodings), cmap="viridis", vmin=-1, vmax=1)
    axis.set(title=title, xlabel="position j", ylabel="position i")
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    return figure


def relative_bias(bias, title="Relative bias per head"):
    """One `(T, S)` panel per head of a `(1, N, T, S)` or `(N, T, S)` bias."""
    bias = np.asarray(bias, dtype=np.float64)
    if bias.ndim == 4:
        bias = bias[0]
    if bias.ndim != 3:
        raise ValueError(
            f"`bias` must have shape (1, N, T, S) or (N, T, S). Received: {bias.shape}"
        )
    heads = bias.shape[0]
    columns = min(heads, 4)
    rows = -(-heads // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3 * rows))
    axes = np.atleast_1d(axes).ravel()
    limit = float(np.abs(bias).max()) or 1.0  # one colour scale for every head
    for head, axis in enumerate(axes):
        if head >= heads:
            axis.axis("off")
            continue
        image = axis.imshow(bias[head], cmap="coolwarm", vmin=-limit, vmax=limit)
        axis.set(title=f"head {head}", xlabel="key position j")
        if head % columns == 0:
            axis.set_ylabel("query position i")
    figure.suptitle(title)
    figure.tight_layout()
    figure.colorbar(image, ax=list(axes), shrink=0.8, label="bias added to the logit")
    return figure


def fusion_gates(gates, title="Gated fusion: weight of the absolute term"):
    """Gate values `(T, D)` of `GatedPositionFusion` (1 = absolute, 0 = relative)."""
    gates = np.asarray(gates, dtype=np.float64)
    if gates.ndim != 2:
        raise ValueError(f"`gates` must have shape (T, D). Received: {gates.shape}")
    figure, axis = plt.subplots(figsize=(6, 3))
    image = axis.imshow(gates.T, aspect="auto", cmap="magma", vmin=0, vmax=1)
    axis.set(title=title, xlabel="position", ylabel="feature")
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    return figure


def generated_positions(per_layer, title="Generated positions across layers"):
    """Similarity maps of the positions a network generates at each layer.

    Args:
        per_layer: list of `(T, D)` arrays, e.g. `hpn(x, l) - x` for each `l`.
    """
    if not per_layer:
        raise ValueError(
            "`per_layer` must hold at least one (T, D) array. Received: []"
        )
    figure, axes = plt.subplots(1, len(per_layer), figsize=(3.2 * len(per_layer), 3.2))
    for layer, (axis, values) in enumerate(zip(np.atleast_1d(axes), per_layer)):
        axis.imshow(_cosine(values), cmap="viridis", vmin=-1, vmax=1)
        axis.set_title(f"layer {layer}")
        axis.set_xticks([])
        axis.set_yticks([])
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def learning_curves(history, title="Learning curves"):
    """Loss and accuracy per epoch from a Keras `History.history` dict."""
    keys = [key for key in history if not key.startswith("val_")]
    figure, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.2))
    for axis, key in zip(np.atleast_1d(axes), keys):
        axis.plot(history[key], label="train")
        if f"val_{key}" in history:
            axis.plot(history[f"val_{key}"], label="validation")
        axis.set(title=key, xlabel="epoch")
        axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def extrapolation(results, lengths, trained_length, ylabel="bits per byte"):
    """One line per method of `{method: [score per length]}` against `lengths`."""
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for method, scores in results.items():
        axis.plot(lengths, scores, marker="o", label=method)
    axis.set_xscale("log", base=2)
    axis.set_xticks(lengths, [str(n) for n in lengths])
    axis.set(
        title=f"Past the training length (L={trained_length})",
        xlabel="evaluation length",
        ylabel=ylabel,
    )
    axis.axvline(trained_length, color="grey", linestyle=":")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    return figure


def _cosine(values):
    """`(T, T)` cosine similarity of the rows of `(T, D)` values."""
    values = np.asarray(values, dtype=np.float64)
    norms = np.maximum(np.linalg.norm(values, axis=1, keepdims=True), 1e-12)
    unit = values / norms
    return unit @ unit.T
