"""What each builder method can do, read from the method table itself.

`capability_table()` is the README's table (a test compares the two, so it
cannot drift): one row per `position=` name of `METHODS`, what it is and its
paper (`GLOSSARY`), then columns computed from the same records and checks
the builders and exporters use. Run `python -m
keras_posenc.models.capabilities` to print it.
"""

import dataclasses

from keras_posenc.models.methods import (
    LOCAL_METHODS,
    LSH_METHODS,
    METHODS,
    QUANTIZED_METHODS,
    rounding_modelled,
)
from keras_posenc.models.stack import TransformerStack

#: `{method: (what it is, in one line, paper)}`, in `METHODS` order.
GLOSSARY = {
    "none": ("no positions: attention sees a bag of tokens", ""),
    "sinusoidal": (
        "fixed sin/cos table added to the token embeddings",
        "[Vaswani et al. 2017](https://arxiv.org/abs/1706.03762)",
    ),
    "learned": (
        "a trainable table of `max_length` positions added to the embeddings",
        "[Devlin et al. 2018](https://arxiv.org/abs/1810.04805)",
    ),
    "combined": (
        "the first attention reads `[x, sinusoid]`, content and position apart",
        "[Ke et al. 2020](https://arxiv.org/abs/2006.15595)",
    ),
    "t5": (
        "a learned bias per log-spaced distance bucket, inside attention",
        "[Raffel et al. 2020](https://arxiv.org/abs/1910.10683)",
    ),
    "clipped": (
        "a learned bias per distance, clipped at `max_distance`",
        "[Shaw et al. 2018](https://arxiv.org/abs/1803.02155)",
    ),
    "alibi": (
        "a fixed linear penalty on distance, one slope per head",
        "[Press et al. 2022](https://arxiv.org/abs/2108.12409)",
    ),
    "dynamic_bias": (
        "a small MLP generates the bias from the log distance",
        "[Wang et al. 2021](https://arxiv.org/abs/2108.00154)",
    ),
    "hpn": (
        "hierarchical position network: a generator per layer adds positions",
        "[Chu et al. 2021](https://arxiv.org/abs/2102.10882)",
    ),
    "recursive": (
        "recursive update: each block refines a position stream by attention",
        "[Shaw et al. 2018](https://arxiv.org/abs/1803.02155)",
    ),
    "hybrid": (
        "sinusoids in, convolutional position generators in later layers",
        "[Chu et al. 2021](https://arxiv.org/abs/2102.10882)",
    ),
    "rope": (
        "rotary: queries and keys turned by position, every scaling type",
        "[Su et al. 2021](https://arxiv.org/abs/2104.09864)",
    ),
    "xpos": (
        "rotary with a per-frequency decay of the logits with distance",
        "[Sun et al. 2022](https://arxiv.org/abs/2212.10554)",
    ),
    "kerple": (
        "a learned logarithmic (or power) decay of distance per head",
        "[Chi et al. 2022](https://arxiv.org/abs/2205.09921)",
    ),
    "fire": (
        "an MLP of the log distance over the log query position",
        "[Li et al. 2024](https://arxiv.org/abs/2310.04418)",
    ),
    "fox": (
        "forgetting gate: a decay computed from each token's content",
        "[Lin et al. 2025](https://arxiv.org/abs/2503.02130)",
    ),
    "cope": (
        "contextual positions counted by the attention's own gates",
        "[Golovneva et al. 2024](https://arxiv.org/abs/2405.18719)",
    ),
    "gated": (
        "a gate fuses sinusoids with a learned relative table",
        "[Ke et al. 2020](https://arxiv.org/abs/2006.15595)",
    ),
}

#: The table's columns, in order.
COLUMNS = (
    "method",
    "what it is",
    "encoder",
    "causal LM",
    "int8 LiteRT",
    "int8 TFLM",
    "QAT",
    "streaming",
    "grouped-query",
    "block-local",
    "LSH",
    "packed",
)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What one builder method can do (each field a bool)."""

    method: str
    encoder: bool
    causal_lm: bool
    int8: bool
    qat: bool
    streaming: bool
    grouped_query: bool
    block_local: bool
    lsh: bool
    packed: bool

    def cells(self):
        """The row's cells, `COLUMNS` order: `yes`, or `-` for no."""
        marks = (
            self.encoder,
            self.causal_lm,
            self.int8,
            self.int8,
            self.qat,
            self.streaming,
            self.grouped_query,
            self.block_local,
            self.lsh,
            self.packed,
        )
        what, paper = GLOSSARY[self.method]
        first = [f"`{self.method}`", what + (f" ({paper})" if paper else "")]
        return first + ["yes" if mark else "-" for mark in marks]


def capabilities(method):
    """The `Capabilities` of `METHODS[method]`.

    int8 (LiteRT and TFLM alike) and QAT need every layer's int8 rounding
    (`methods.rounding_modelled`: `fox` and `cope` export at float32 only);
    streaming needs positions that live in the attention
    (`TransformerStack.streaming_blocker` of a causal stack); every method
    builds encoders and causal LMs, block-local and on packed rows;
    grouped-query attention where the stack takes `num_key_value_heads`.
    """
    record = METHODS[method]
    stack = TransformerStack(method, 8, 1, 2, causal=True)
    return Capabilities(
        method=method,
        encoder=True,
        causal_lm=True,
        int8=rounding_modelled(record),
        qat=method in QUANTIZED_METHODS,
        streaming=stack.streaming_blocker() is None,
        grouped_query=_builds_grouped_query(method),
        block_local=method in LOCAL_METHODS,
        lsh=method in LSH_METHODS,
        packed=True,
    )


def _builds_grouped_query(method):
    """Whether the stack of `method` takes `num_key_value_heads` (it checks)."""
    try:
        TransformerStack(
            method, 8, 1, 2, causal=True, attention_options={"num_key_value_heads": 1}
        )
    except ValueError:
        return False
    return True


def capability_table():
    """The README's capability table, as Markdown."""
    rows = [COLUMNS, ("---",) * len(COLUMNS)]
    rows += [capabilities(method).cells() for method in METHODS]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


if __name__ == "__main__":
    print(capability_table())
