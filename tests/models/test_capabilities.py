"""The README's capability table against what the builders and exporters do."""

import pytest

from keras_posenc.generation import Streaming
from keras_posenc.models import (
    METHODS,
    build_causal_lm,
    build_encoder,
    capabilities,
)
from tflite_export.convert import integer_blockers

SMALL = dict(
    hidden_dim=8, num_heads=2, num_layers=1, position_options={"max_length": 16}
)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_row_is_what_the_builders_and_exporter_do(method):
    row = capabilities.capabilities(method)
    encoder = build_encoder(vocab_size=9, position=method, packed=True, **SMALL)
    lm = build_causal_lm(9, position=method, packed=row.packed, **SMALL)
    assert row.encoder and row.causal_lm and row.packed and row.block_local
    assert row.int8 == (not integer_blockers(encoder)) == (not integer_blockers(lm))
    if row.streaming:
        assert lm.check_streaming(Streaming(4)) == (4, 8)
    else:
        with pytest.raises(ValueError, match="streaming.*None for this model"):
            lm.check_streaming(Streaming(4))
    if row.grouped_query:
        grouped = build_causal_lm(9, position=method, num_key_value_heads=1, **SMALL)
        keys = grouped.cache_kinds().index("keys")
        assert grouped.cache_shapes(1, 4)[keys][1] == 1  # one key head cached
    else:
        with pytest.raises(ValueError, match="num_key_value_heads"):
            build_causal_lm(9, position=method, num_key_value_heads=1, **SMALL)
    if not row.lsh:
        with pytest.raises(ValueError, match="attention_type"):
            build_encoder(
                vocab_size=9,
                position=method,
                **SMALL,
                attention_options={"attention_type": "lsh"},
            )


def test_the_table_has_a_row_with_its_summary_for_every_method():
    table = capabilities.capability_table().splitlines()
    assert len(table) == 2 + len(METHODS)
    for line, (method, row) in zip(table[2:], METHODS.items()):
        assert row.summary and line.startswith(f"| `{method}` | {row.summary}")
        generated = line.split(" | ")[2]
        assert generated == ("yes" if row.generated else "-")
