"""The builders' position methods: one record per `position=` name.

Adding a method is adding a row to `METHODS`: which absolute encoding the
embeddings get, which bias producer every attention carries, whether a
position generator network feeds the layers, and which block the layers are.
`position_options` of a builder go to the layer each option names here.
"""

import dataclasses

from keras_posenc import _checks
from keras_posenc._backend import BACKENDS
from keras_posenc.layers.combined_position_input import CombinedPositionInput
from keras_posenc.layers.contextual_position import ContextualPosition
from keras_posenc.layers.data_adaptive_bias import DataAdaptiveBias
from keras_posenc.layers.dynamic_position_bias import DynamicPositionBias
from keras_posenc.layers.fire_bias import FireBias
from keras_posenc.layers.forgetting_gate import ForgettingGate
from keras_posenc.layers.gated_position_fusion import GatedPositionFusion
from keras_posenc.layers.hierarchical_position_network import (
    HierarchicalPositionNetwork,
)
from keras_posenc.layers.kerple_bias import KerpleBias
from keras_posenc.layers.learned_position_embedding import LearnedPositionEmbedding
from keras_posenc.layers.recursive_position_update import RecursivePositionUpdate
from keras_posenc.layers.relative_position_bias import RelativePositionBias
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)

#: Where a position option goes: the constructor of that part's layer.
PARTS = (
    "sinusoid",
    "learned",
    "fusion",
    "bias",
    "static",
    "generator",
    "block",
    "rotary",
    "gate",
    "cope",
)


@dataclasses.dataclass(frozen=True)
class PositionMethod:
    """One position method: what it is, and how the builders assemble it.

    Every list of methods (the capability table, which methods stream, run
    LSH, share a bias, model their int8 rounding, which layers generate
    positions) is derived from these records.

    Attributes:
        summary: str, what the method is, in one line.
        paper: str, its paper as a Markdown link, or `""`.
        generated: bool, a network computes the positions (an MLP,
            attention or a gate), rather than a table or a formula.
        input_positions: str or None, the absolute encoding added to the
            token embeddings: `"sinusoidal"`, `"learned"` or `"gated"`
            (sinusoids fused with a learned relative table by a gate).
        bias: str or None, the bias producer of every attention:
            a key of `BIASES`.
        bias_arguments: dict, fixed constructor arguments of the bias.
        static_bias: str or None, for a bias that refines another
            (`"dape"`), the key of `BIASES` it refines.
        bias_needs_grid: bool, the bias is added only with `grid_shape`.
        generator: str or None, the `position_features` of a
            `HierarchicalPositionNetwork` that feeds the layers.
        generator_from: int, the first layer the generator feeds.
        recursive: bool, the layers are `RecursivePositionUpdate` blocks.
        combined_input: bool, the first attention reads `[x, sinusoid(x)]`.
        rotary: dict or None, fixed `RotaryEmbedding` arguments: every
            attention rotates its queries and keys (axial over `grid_shape`).
        forgetting_gate: bool, every attention gets the decay bias of a
            `ForgettingGate` on its input (a cache state when decoding).
        contextual: bool, every attention counts its own positions
            (`ContextualPosition`, CoPE).
        options: dict, `{option: part}` for the `position_options` taken.
        defaults: callable `max_length -> dict` of default options.
    """

    summary: str = ""
    paper: str = ""
    generated: bool = False
    input_positions: str = None
    bias: str = None
    bias_arguments: dict = dataclasses.field(default_factory=dict)
    static_bias: str = None
    bias_needs_grid: bool = False
    generator: str = None
    generator_from: int = 0
    recursive: bool = False
    combined_input: bool = False
    rotary: dict = None
    forgetting_gate: bool = False
    contextual: bool = False
    options: dict = dataclasses.field(default_factory=dict)
    defaults: object = None

    @property
    def backends(self):
        """The Keras backends the method trains and generates on: all of
        `BACKENDS` (its layers are written with `xp`, keras_posenc/_backend.py)."""
        return BACKENDS

    def resolve_options(self, position_options, max_length):
        """`{part: constructor kwargs}` from the defaults and the user's options."""
        if position_options is not None and not isinstance(position_options, dict):
            _checks.fail(
                "position_options", "a dict or None", position_options, error=TypeError
            )
        position_options = dict(position_options or {})
        unknown = sorted(set(position_options) - set(self.options))
        if unknown:
            _checks.fail(
                "position_options",
                f"a dict with keys among {sorted(self.options)} for this method",
                position_options,
                fix=f"Unknown: {unknown}",
            )
        parts = {part: {} for part in PARTS}
        for name, value in {
            **(self.defaults(max_length) if self.defaults else {}),
            **position_options,
        }.items():
            parts[self.options[name]][name] = value
        return parts

    def input_layers(self, parts, max_length, causal=False):
        """The absolute encoding's layers `(encoding, *fusion)`, or None.

        The encoding maps the embeddings `(B, T, D)` to positions `(B, T, D)`;
        each following layer refines them (the gate of `"gated"`).
        """
        if self.input_positions is None:
            return None
        return INPUT_POSITIONS[self.input_positions](parts, max_length, causal)

    @property
    def reads_logits(self):
        """Whether its bias reads the attention's logits (DAPE)."""
        return getattr(BIASES.get(self.bias), "reads_logits", False)

    @property
    def int8_kernels(self):
        """Whether TFLite and TFLM have int8 kernels for all its ops: all but
        the forgetting gate's and CoPE's cumulative sums, logs and floors."""
        return not (self.forgetting_gate or self.contextual)

    @property
    def rounding_modelled(self):
        """Whether every layer models its int8 rounding (`quantize=True`)."""
        return self.int8_kernels and not self.reads_logits

    @property
    def runs_lsh(self):
        """Whether it runs LSH attention: not the recursive blocks (their two
        attentions are their own), the forgetting gate (a per-example bias
        on every pair), CoPE (a count in text order, which LSH's chunks do
        not keep) nor a bias that reads all heads of a pair (DAPE)."""
        return (
            not (self.recursive or self.forgetting_gate or self.contextual)
            and not self.reads_logits
        )

    @property
    def shares_bias(self):
        """Whether its attentions can share one bias: a bias that reads no
        logits (a shared one reaches the layers as `attention_bias`)."""
        return self.bias is not None and not self.reads_logits

    def layer_classes(self):
        """The classes of the position layers it builds."""
        found = [CLASSES_OF_INPUT.get(self.input_positions, ())]
        found += [(BIASES[name],) for name in (self.bias, self.static_bias) if name]
        for flag, classes in (
            (self.generator is not None, (HierarchicalPositionNetwork,)),
            (self.recursive, (RecursivePositionUpdate,)),
            (self.combined_input, (SinusoidalPositionEncoding, CombinedPositionInput)),
            (self.rotary is not None, (RotaryEmbedding,)),
            (self.forgetting_gate, (ForgettingGate,)),
            (self.contextual, (ContextualPosition,)),
        ):
            found.append(classes if flag else ())
        return tuple(dict.fromkeys(cls for classes in found for cls in classes))

    @property
    def takes_grid(self):
        """Whether `grid_shape` means something to this method."""
        return self.bias == "dynamic" or self.rotary is not None

    def rotary_layer(self, index, grid_shape, parts):
        """The `RotaryEmbedding` of attention `index`, or None."""
        if self.rotary is None:
            return None
        arguments = dict(self.rotary, **parts["rotary"])
        if grid_shape:
            arguments.update(coordinate_dim=len(grid_shape), grid_shape=grid_shape)
        return RotaryEmbedding(name=f"rotary_{index}", **arguments)

    def gate_layer(self, num_heads, index, parts):
        """The `ForgettingGate` of attention `index`, or None."""
        if not self.forgetting_gate:
            return None
        name = f"forgetting_gate_{index}"
        return ForgettingGate(num_heads, name=name, **parts["gate"])

    def contextual_layer(self, index, parts):
        """The `ContextualPosition` of attention `index`, or None."""
        if not self.contextual:
            return None
        return ContextualPosition(name=f"cope_{index}", **parts["cope"])

    def bias_layer(self, num_heads, index, grid_shape, parts):
        """The bias producer of attention `index`, or None."""
        if self.bias is None or (self.bias_needs_grid and not grid_shape):
            return None
        arguments = dict(self.bias_arguments, **parts["bias"])
        if self.static_bias is not None:  # the bias it refines, its own layer
            arguments["static_bias"] = BIASES[self.static_bias](
                num_heads, name=f"static_bias_{index}", **parts["static"]
            )
        if self.bias == "dynamic":
            arguments.update(
                coordinate_dim=len(grid_shape) if grid_shape else 1,
                grid_shape=grid_shape,
            )
        name = "dynamic_bias" if self.bias == "dynamic" else "bias"
        return BIASES[self.bias](num_heads, name=f"{name}_{index}", **arguments)


def _sinusoidal(parts, max_length, causal):
    return (
        SinusoidalPositionEncoding(name="sinusoidal_positions", **parts["sinusoid"]),
    )


def _learned(parts, max_length, causal):
    return (
        LearnedPositionEmbedding(
            max_length, name="learned_positions", **parts["learned"]
        ),
    )


def _gated(parts, max_length, causal):
    return (
        SinusoidalPositionEncoding(name="gated_absolute", **parts["sinusoid"]),
        GatedPositionFusion(causal=causal, name="gated_fusion", **parts["fusion"]),
    )


#: The absolute encodings a method may add to the embeddings, by name.
INPUT_POSITIONS = {"sinusoidal": _sinusoidal, "learned": _learned, "gated": _gated}
#: The classes of the layers each absolute encoding builds.
CLASSES_OF_INPUT = {
    "sinusoidal": (SinusoidalPositionEncoding,),
    "learned": (LearnedPositionEmbedding,),
    "gated": (SinusoidalPositionEncoding, GatedPositionFusion),
}


#: The bias producers a method may give every attention, by name.
BIASES = {
    "relative": RelativePositionBias,
    "dynamic": DynamicPositionBias,
    "kerple": KerpleBias,
    "fire": FireBias,
    "dape": DataAdaptiveBias,
}
#: The producers that take `bidirectional` (a causal stack sets it False;
#: for DAPE, its static bias's).
DIRECTED_BIASES = ("relative", "kerple", "fire")


def _clipped_default(max_length):
    return {"max_distance": min(max_length, 32)}


_SINUSOID = {"max_wavelength": "sinusoid"}
_RELATIVE = {
    "num_buckets": "bias",
    "max_distance": "bias",
    "bidirectional": "bias",
    "initializer": "bias",
}
_DYNAMIC = {
    "hidden_dim": "bias",
    "num_layers": "bias",
    "log_distance": "bias",
    "kernel_initializer": "bias",
}
_ROTARY = {
    name: "rotary"
    for name in (
        "max_wavelength",
        "rotary_dim",
        "interleaved",
        "rope_type",
        "scaling_factor",
        "original_max_position_embeddings",
        "rope_parameters",
    )
}
_GENERATOR = {
    "num_generators": "generator",
    "kernel_size": "generator",
    "position_l2": "generator",
}

#: Every builder method, by its `position=` name.
METHODS = {
    "none": PositionMethod(
        summary="no positions: attention sees a bag of tokens",
    ),
    "sinusoidal": PositionMethod(
        summary="fixed sin/cos table added to the token embeddings",
        paper="[Vaswani et al. 2017](https://arxiv.org/abs/1706.03762)",
        input_positions="sinusoidal",
        options=_SINUSOID,
    ),
    "learned": PositionMethod(
        summary="a trainable table of `max_length` positions added to the embeddings",
        paper="[Devlin et al. 2018](https://arxiv.org/abs/1810.04805)",
        input_positions="learned",
        options={"initializer": "learned"},
    ),
    "combined": PositionMethod(
        summary="the first attention reads `[x, sinusoid]`, content and position apart",
        paper="[Ke et al. 2020](https://arxiv.org/abs/2006.15595)",
        combined_input=True,
        options=_SINUSOID,
    ),
    "t5": PositionMethod(
        summary="a learned bias per log-spaced distance bucket, inside attention",
        paper="[Raffel et al. 2020](https://arxiv.org/abs/1910.10683)",
        bias="relative",
        bias_arguments={"mode": "t5"},
        options=_RELATIVE,
        defaults=lambda max_length: {"max_distance": 128},
    ),
    "clipped": PositionMethod(
        summary="a learned bias per distance, clipped at `max_distance`",
        paper="[Shaw et al. 2018](https://arxiv.org/abs/1803.02155)",
        bias="relative",
        bias_arguments={"mode": "clipped"},
        options=_RELATIVE,
        defaults=_clipped_default,
    ),
    "alibi": PositionMethod(
        summary="a fixed linear penalty on distance, one slope per head",
        paper="[Press et al. 2022](https://arxiv.org/abs/2108.12409)",
        bias="relative",
        bias_arguments={"mode": "alibi"},
        options={"bidirectional": "bias"},
    ),
    "dynamic_bias": PositionMethod(
        summary="a small MLP generates the bias from the log distance",
        paper="[Wang et al. 2021](https://arxiv.org/abs/2108.00154)",
        generated=True,
        bias="dynamic",
        options=_DYNAMIC,
    ),
    "hpn": PositionMethod(
        summary="hierarchical position network: a generator per layer adds positions",
        paper="[Chu et al. 2021](https://arxiv.org/abs/2102.10882)",
        generated=True,
        generator="sinusoid",
        options={
            **_GENERATOR,
            "hidden_dim": "generator",
            "max_wavelength": "generator",
        },
    ),
    "recursive": PositionMethod(
        summary="recursive update: each block refines a position stream by attention",
        paper="[Shaw et al. 2018](https://arxiv.org/abs/1803.02155)",
        generated=True,
        recursive=True,
        options={
            "position_heads": "block",
            "position_key_dim": "block",
            "ff_dim": "block",
            "epsilon": "block",
        },
    ),
    "hybrid": PositionMethod(
        summary="sinusoids in, convolutional position generators in later layers",
        paper="[Chu et al. 2021](https://arxiv.org/abs/2102.10882)",
        generated=True,
        input_positions="sinusoidal",
        bias="dynamic",
        bias_needs_grid=True,
        generator="conv",
        generator_from=1,
        options={**_SINUSOID, **_GENERATOR, "num_layers": "bias"},
    ),
    "rope": PositionMethod(
        summary="rotary: queries and keys turned by position, every scaling type",
        paper="[Su et al. 2021](https://arxiv.org/abs/2104.09864)",
        rotary={},
        options=_ROTARY,
    ),
    "xpos": PositionMethod(
        summary="rotary with a per-frequency decay of the logits with distance",
        paper="[Sun et al. 2022](https://arxiv.org/abs/2212.10554)",
        rotary={"xpos_scale_base": 512.0},
        options={**_ROTARY, "xpos_scale_base": "rotary"},
    ),
    "kerple": PositionMethod(
        summary="a learned logarithmic (or power) decay of distance per head",
        paper="[Chi et al. 2022](https://arxiv.org/abs/2205.09921)",
        bias="kerple",
        options={"kernel": "bias", "bidirectional": "bias"},
    ),
    "fire": PositionMethod(
        summary="an MLP of the log distance over the log query position",
        paper="[Li et al. 2024](https://arxiv.org/abs/2310.04418)",
        generated=True,
        bias="fire",
        options={
            "hidden_dim": "bias",
            "bidirectional": "bias",
            "initial_threshold": "bias",
            "kernel_initializer": "bias",
        },
    ),
    "fox": PositionMethod(
        summary="forgetting gate: a decay computed from each token's content",
        paper="[Lin et al. 2025](https://arxiv.org/abs/2503.02130)",
        generated=True,
        forgetting_gate=True,
        options={
            "bidirectional": "gate",
            "initial_bias": "gate",
            "kernel_initializer": "gate",
        },
    ),
    "cope": PositionMethod(
        summary="contextual positions counted by the attention's own gates",
        paper="[Golovneva et al. 2024](https://arxiv.org/abs/2405.18719)",
        generated=True,
        contextual=True,
        options={
            "max_position": "cope",
            "initializer": "cope",
            "bidirectional": "cope",
        },
    ),
    "gated": PositionMethod(
        summary="a gate fuses sinusoids with a learned relative table",
        paper="[Ke et al. 2020](https://arxiv.org/abs/2006.15595)",
        generated=True,
        input_positions="gated",
        options={**_SINUSOID, "max_distance": "fusion"},
        defaults=_clipped_default,
    ),
    "dape": PositionMethod(
        summary="an MLP refines a kerple bias from each pair's logits of all heads",
        paper="[Zheng et al. 2024](https://arxiv.org/abs/2405.14722)",
        generated=True,
        bias="dape",
        static_bias="kerple",
        options={
            "hidden_dim": "bias",
            "kernel_initializer": "bias",
            "kernel": "static",
            "bidirectional": "static",
        },
    ),
}

#: Methods that run block-local (`attention_window`): all of them (the
#: forgetting gate gives its bias on the band, CoPE counts over the band).
LOCAL_METHODS = tuple(METHODS)
#: Methods that run LSH attention (`{"attention_type": "lsh"}`, `runs_lsh`).
LSH_METHODS = tuple(name for name, method in METHODS.items() if method.runs_lsh)
#: Methods whose attentions can share one bias (`share_position_bias=True`).
SHARED_BIAS_METHODS = tuple(
    name for name, method in METHODS.items() if method.shares_bias
)
#: The methods whose ops all have int8 kernels (full-int8 LiteRT and TFLM).
INT8_METHODS = tuple(name for name, method in METHODS.items() if method.int8_kernels)
#: The methods whose every layer models its int8 rounding (`quantize=True`).
QUANTIZED_METHODS = tuple(
    name for name, method in METHODS.items() if method.rounding_modelled
)
#: The methods whose positions a network computes (`PositionMethod.generated`).
GENERATED_METHODS = tuple(name for name, method in METHODS.items() if method.generated)
#: The classes of every method's position layers, in `METHODS` order.
POSITION_LAYERS = tuple(
    dict.fromkeys(cls for method in METHODS.values() for cls in method.layer_classes())
)
