"""`docs/attention.md`'s table: every cell called, so it cannot drift."""

import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

import keras_posenc as kp

TABLE = (
    pathlib.Path(__file__).resolve().parents[2] / "docs" / "attention.md"
).read_text()
PATHS = ("dense", "block-local", "LSH", "cached")
T, NEW = 8, 2  # sequence length; new tokens of a cached call


def cells():
    rows = re.findall(
        r"^\| (`?[^|]+?) \| (\w+) \| (\w+) \| (\w+) \| (\w+) \|$", TABLE, re.M
    )
    return [
        (row[0], path, cell)
        for row in rows
        if row[0] != "argument"
        for path, cell in zip(PATHS, row[1:])
    ]


def _layer(path, **kwargs):
    arguments = dict(num_heads=2, key_dim=4, position_bias=kp.RelativePositionBias(2))
    if path == "block-local":
        arguments["attention_window"] = 4
    if path == "LSH":
        arguments["attention_options"] = {"attention_type": "lsh", "bucket_size": 4}
    return kp.RelativeMultiHeadAttention(**{**arguments, **kwargs})


def _arguments(name, path, cell):
    """`(constructor kwargs, call kwargs)` that exercise row `name`."""
    q = NEW if path == "cached" else T
    if name.startswith("`rotary`"):
        return {"rotary": kp.RotaryEmbedding()}, {}
    if name.startswith("`contextual_position`"):
        return {"contextual_position": kp.ContextualPosition(2)}, {}
    if name.startswith("`position_bias` reading"):
        static = kp.RelativePositionBias(2)
        return {"position_bias": kp.DataAdaptiveBias(2, static, hidden_dim=4)}, {}
    if name.startswith("`quantize`"):
        return {"quantize": "cache" if path == "cached" else True}, {}
    if name.startswith("`num_key_value_heads`"):
        return {"num_key_value_heads": 1}, {}
    band = (1, 2 * 2, 4, 12)  # (1, N * nb, W, 3W), nb = 2 blocks of 4
    call = {
        "Keras masks": {
            "query_mask": np.ones((1, q), bool),
            "value_mask": np.ones((1, T), bool),
        },
        "`use_causal_mask`": {"use_causal_mask": True},
        "`attention_mask`": {"attention_mask": np.ones((1, q, T), bool)},
        "`attention_bias`": {
            "attention_bias": tf.zeros(band if cell == "band" else (1, 2, q, T))
        },
        "`positions`, `key_positions`": {
            "positions": tf.range(q),
            "key_positions": tf.range(T),
        },
        "`return_attention_scores`": {"return_attention_scores": True},
        "`segment_ids` (packed rows)": {"segment_ids": np.ones((1, q), "int32")},
    }
    key = next(k for k in call if name.startswith(k))
    return {}, call[key]


@pytest.mark.parametrize("name, path, cell", cells())
def test_each_cell_is_what_the_layer_does(name, path, cell):
    x = tf.random.stateless_normal((1, T, 6), seed=[0, 1])
    built, called = _arguments(name, path, cell)

    def run():
        layer = _layer(path, **built)
        if path == "cached":
            heads = built.get("num_key_value_heads", 2)
            cache = tf.zeros((1, 2, T, heads, 4))
            return layer(x[:, :NEW], cache=cache, cache_update_index=0, **called)
        return layer(x, **called)

    if cell == "no":  # refused naming the argument (or, cached, the cache)
        words = re.findall(r"`(\w+)`", name) + ["cache"] * (path == "cached")
        with pytest.raises(ValueError, match="|".join(f"`{w}`" for w in words)):
            run()
    else:
        out = run()
        out = out[0] if isinstance(out, tuple) else out
        assert np.isfinite(np.asarray(out)).all()


def test_the_table_has_every_path_and_row():
    assert len(cells()) == 12 * len(PATHS)
