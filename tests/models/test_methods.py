import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import (
    ContextualPosition,
    RelativeMultiHeadAttention,
    RelativePositionBias,
)
from keras_posenc.models import (
    POSITION_METHODS,
    build_causal_lm,
    build_encoder,
    capabilities,
    methods,
)
from keras_posenc.utils import nested_layers


def test_every_option_is_an_argument_of_the_layer_it_goes_to():
    import inspect

    import keras_posenc

    layers = {
        "sinusoid": keras_posenc.SinusoidalPositionEncoding,
        "learned": keras_posenc.LearnedPositionEmbedding,
        "fusion": keras_posenc.GatedPositionFusion,
        "generator": keras_posenc.HierarchicalPositionNetwork,
        "block": keras_posenc.RecursivePositionUpdate,
        "rotary": keras_posenc.RotaryEmbedding,
        "gate": keras_posenc.ForgettingGate,
        "cope": keras_posenc.ContextualPosition,
    }
    assert set(POSITION_METHODS) == set(methods.METHODS)
    for name, record in methods.METHODS.items():
        layers["bias"] = methods.BIASES.get(record.bias)
        layers["static"] = methods.BIASES.get(record.static_bias)
        for option, part in record.options.items():
            layer = layers[part]
            arguments = inspect.signature(layer.__init__).parameters
            assert option in arguments, (name, option, layer.__name__)


@pytest.mark.parametrize("position", ["t5", "clipped"])
def test_position_options_reach_the_bias_layers(position):
    model = build_encoder(
        vocab_size=9,
        hidden_dim=8,
        num_heads=2,
        position=position,
        position_options={"max_distance": 20, "bidirectional": False},
    )
    biases = [
        layer
        for layer in nested_layers(model)
        if isinstance(layer, RelativePositionBias)
    ]
    assert len(biases) == 2
    assert all(b.max_distance == 20 and not b.bidirectional for b in biases)


def test_defaults_follow_max_length_unless_overridden():
    parts = methods.METHODS["clipped"].resolve_options(None, max_length=10)
    assert parts["bias"] == {"max_distance": 10}
    parts = methods.METHODS["gated"].resolve_options({"max_distance": 3}, 100)
    assert parts["fusion"] == {"max_distance": 3}


def test_unknown_position_option_is_refused():
    with pytest.raises(ValueError, match="`position_options` must be a dict with keys"):
        build_encoder(
            vocab_size=9, position="alibi", position_options={"num_buckets": 8}
        )


@pytest.mark.parametrize("position", ["t5", "recursive", "hybrid"])
def test_dropout_means_attention_weights_in_every_method(position):
    model = build_encoder(
        vocab_size=9, hidden_dim=8, num_heads=2, position=position, dropout=0.25
    )
    attentions = [
        layer
        for layer in nested_layers(model)
        if isinstance(layer, RelativeMultiHeadAttention)
    ]
    assert attentions and all(a.dropout == 0.25 for a in attentions)


def test_adding_a_method_is_adding_a_row(monkeypatch):
    row = methods.PositionMethod(
        input_positions="sinusoidal", bias="relative", bias_arguments={"mode": "alibi"}
    )
    monkeypatch.setitem(methods.METHODS, "alibi_sinusoidal", row)
    model = build_encoder(
        vocab_size=9, hidden_dim=8, num_heads=2, position="alibi_sinusoidal"
    )
    names = {layer.name for layer in model.layers}
    assert {"sinusoidal_positions", "attention_0", "attention_1"} <= names
    bias = model.get_layer("attention_0").position_bias
    assert bias.mode == "alibi"
    out = model(np.arange(1, 7)[None])
    assert out.shape == (1, 6, 8) and np.all(np.isfinite(out))
    assert isinstance(bias, tf.keras.layers.Layer)


def test_position_options_must_be_a_dict():
    with pytest.raises(TypeError, match="`position_options` must be a dict or None"):
        build_encoder(vocab_size=9, position="t5", position_options=[("a", 1)])


def test_one_new_row_gives_an_encoder_and_a_causal_lm(monkeypatch):
    """Adding a method is adding a row: both builders assemble it, unchanged."""
    row = methods.PositionMethod(
        input_positions="sinusoidal",
        bias="relative",
        bias_arguments={"mode": "clipped"},
        options={"max_distance": "bias"},
        defaults=lambda max_length: {"max_distance": 3},
    )
    monkeypatch.setitem(methods.METHODS, "sinusoid_clipped", row)
    encoder = build_encoder(
        vocab_size=9, hidden_dim=8, num_heads=2, position="sinusoid_clipped"
    )
    lm = build_causal_lm(
        vocab_size=9, hidden_dim=8, num_heads=2, position="sinusoid_clipped"
    )
    for model, bidirectional in ((encoder, True), (lm, False)):
        layers = nested_layers(model)
        biases = [x for x in layers if isinstance(x, RelativePositionBias)]
        assert [b.mode for b in biases] == ["clipped", "clipped"]
        assert {b.max_distance for b in biases} == {3}
        assert {b.bidirectional for b in biases} == {bidirectional}
        names = {x.name for x in layers}
        assert "sinusoidal_positions" in names
    ids = np.random.randint(1, 9, size=(2, 6)).astype("int32")
    assert encoder(ids).shape == (2, 6, 8)
    logits = lm(ids).numpy()
    changed = ids.copy()
    changed[:, 4] = (changed[:, 4] % 8) + 1  # the causal LM: no earlier logit moves
    np.testing.assert_allclose(lm(changed).numpy()[:, :4], logits[:, :4], atol=1e-5)


def test_cope_counts_both_ways_in_an_encoder_and_one_way_in_a_causal_lm():
    encoder = build_encoder(vocab_size=9, hidden_dim=8, num_heads=2, position="cope")
    lm = build_causal_lm(vocab_size=9, hidden_dim=8, num_heads=2, position="cope")
    one_way = build_encoder(
        vocab_size=9,
        hidden_dim=8,
        num_heads=2,
        position="cope",
        position_options={"bidirectional": False},
    )
    for model, bidirectional in ((encoder, True), (lm, False), (one_way, False)):
        counts = [x for x in nested_layers(model) if isinstance(x, ContextualPosition)]
        assert counts and {c.bidirectional for c in counts} == {bidirectional}


#: Where the docs write a list of methods: `(page, list)`, between markers.
DOC_LISTS = {
    ("docs/layers.md", "all"),
    ("docs/edge_deployment.md", "quantized"),
    ("docs/lm_on_device.md", "quantized"),
    ("docs/lm_on_device.md", "streaming"),
    ("docs/language_models.md", "streaming"),
}


def test_every_list_of_methods_in_the_docs_is_the_method_tables():
    """Each marked list is the one `capabilities.method_list` writes from
    the rows, word for word: a row added or changed fails here until
    `python -m keras_posenc.models.capabilities --docs ...` rewrites it."""
    root = pathlib.Path(__file__).resolve().parents[2]
    found = set()
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for _, name, span, _ in capabilities.MARKED.findall(path.read_text()):
            names = tuple(re.findall(r"`(\w+)`", span))
            assert names == capabilities.DOC_LISTS[name][0](), (path.name, name)
            assert span == capabilities.method_list(name), (path.name, name)
            found.add((str(path.relative_to(root)), name))
    assert found == DOC_LISTS


def test_the_docs_writer_rewrites_a_stale_list_and_nothing_else():
    stale = "Streams: <!-- methods: streaming -->`none` and `t5`<!-- /methods -->."
    written = capabilities.with_method_lists(stale + " Kept: `t5`.")
    assert written.endswith(". Kept: `t5`.")
    assert capabilities.method_list("streaming") in written
    assert "`dape`" in written and capabilities.with_method_lists(written) == written
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert capabilities.with_method_lists(readme) == readme  # table and lists


def test_the_derived_lists_follow_each_rows_facts():
    rows = methods.METHODS
    assert methods.LSH_METHODS == tuple(n for n, r in rows.items() if r.runs_lsh)
    assert "dape" not in methods.LSH_METHODS + methods.SHARED_BIAS_METHODS
    assert "dape" in methods.INT8_METHODS and "dape" not in methods.QUANTIZED_METHODS
    assert set(methods.GENERATED_METHODS) >= {"dape", "hpn", "recursive", "fox"}
    assert not {"t5", "alibi", "rope", "sinusoidal"} & set(methods.GENERATED_METHODS)
    for row in rows.values():  # every layer a row builds is in POSITION_LAYERS
        assert set(row.layer_classes()) <= set(methods.POSITION_LAYERS)


@pytest.mark.parametrize("position", sorted(methods.METHODS))
def test_warmup_freezes_every_layer_holding_a_methods_position_weights(position):
    from keras_posenc.training.callbacks import find_generators

    model = build_encoder(vocab_size=9, hidden_dim=8, num_heads=2, position=position)
    generators = {id(layer) for layer in find_generators(model)}
    for layer in nested_layers(model):
        if isinstance(layer, methods.POSITION_LAYERS) and layer.trainable_weights:
            inside_recursive = position == "recursive"
            assert id(layer) in generators or inside_recursive, layer.name
    held = methods.METHODS[position]
    if held.generated and position != "recursive":
        assert generators, position
