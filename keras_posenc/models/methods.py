"""The builders' position methods: one record per `position=` name.

Adding a method is adding a row to `METHODS`: which absolute encoding the
embeddings get, which bias producer every attention carries, whether a
position generator network feeds the layers, and which block the layers are.
`position_options` of a builder go to the layer each option names here.
"""

import dataclasses

from keras_posenc import _checks
from keras_posenc.layers.contextual_position import ContextualPosition
from keras_posenc.layers.dynamic_position_bias import DynamicPositionBias
from keras_posenc.layers.fire_bias import FireBias
from keras_posenc.layers.forgetting_gate import ForgettingGate
from keras_posenc.layers.gated_position_fusion import GatedPositionFusion
from keras_posenc.layers.kerple_bias import KerpleBias
from keras_posenc.layers.learned_position_embedding import LearnedPositionEmbedding
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
    "generator",
    "block",
    "rotary",
    "gate",
    "cope",
)


@dataclasses.dataclass(frozen=True)
class PositionMethod:
    """How the builders assemble one position method.

    Attributes:
        input_positions: str or None, the absolute encoding added to the
            token embeddings: `"sinusoidal"`, `"learned"` or `"gated"`
            (sinusoids fused with a learned relative table by a gate).
        bias: str or None, the bias producer of every attention:
            `"relative"` (`RelativePositionBias`), `"dynamic"`
            (`DynamicPositionBias`), `"kerple"` (`KerpleBias`) or `"fire"`
            (`FireBias`).
        bias_arguments: dict, fixed constructor arguments of the bias.
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

    input_positions: str = None
    bias: str = None
    bias_arguments: dict = dataclasses.field(default_factory=dict)
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


#: The bias producers a method may give every attention, by name.
BIASES = {
    "relative": RelativePositionBias,
    "dynamic": DynamicPositionBias,
    "kerple": KerpleBias,
    "fire": FireBias,
}
#: The producers that take `bidirectional` (a causal stack sets it False).
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
    "none": PositionMethod(),
    "sinusoidal": PositionMethod(input_positions="sinusoidal", options=_SINUSOID),
    "learned": PositionMethod(
        input_positions="learned", options={"initializer": "learned"}
    ),
    "combined": PositionMethod(combined_input=True, options=_SINUSOID),
    "t5": PositionMethod(
        bias="relative",
        bias_arguments={"mode": "t5"},
        options=_RELATIVE,
        defaults=lambda max_length: {"max_distance": 128},
    ),
    "clipped": PositionMethod(
        bias="relative",
        bias_arguments={"mode": "clipped"},
        options=_RELATIVE,
        defaults=_clipped_default,
    ),
    "alibi": PositionMethod(
        bias="relative",
        bias_arguments={"mode": "alibi"},
        options={"bidirectional": "bias"},
    ),
    "dynamic_bias": PositionMethod(bias="dynamic", options=_DYNAMIC),
    "hpn": PositionMethod(
        generator="sinusoid",
        options={
            **_GENERATOR,
            "hidden_dim": "generator",
            "max_wavelength": "generator",
        },
    ),
    "recursive": PositionMethod(
        recursive=True,
        options={
            "position_heads": "block",
            "position_key_dim": "block",
            "ff_dim": "block",
            "epsilon": "block",
        },
    ),
    "hybrid": PositionMethod(
        input_positions="sinusoidal",
        bias="dynamic",
        bias_needs_grid=True,
        generator="conv",
        generator_from=1,
        options={**_SINUSOID, **_GENERATOR, "num_layers": "bias"},
    ),
    "rope": PositionMethod(rotary={}, options=_ROTARY),
    "xpos": PositionMethod(
        rotary={"xpos_scale_base": 512.0},
        options={**_ROTARY, "xpos_scale_base": "rotary"},
    ),
    "kerple": PositionMethod(
        bias="kerple", options={"kernel": "bias", "bidirectional": "bias"}
    ),
    "fire": PositionMethod(
        bias="fire",
        options={
            "hidden_dim": "bias",
            "bidirectional": "bias",
            "initial_threshold": "bias",
            "kernel_initializer": "bias",
        },
    ),
    "fox": PositionMethod(
        forgetting_gate=True,
        options={
            "bidirectional": "gate",
            "initial_bias": "gate",
            "kernel_initializer": "gate",
        },
    ),
    "cope": PositionMethod(
        contextual=True,
        options={
            "max_position": "cope",
            "initializer": "cope",
            "bidirectional": "cope",
        },
    ),
    "gated": PositionMethod(
        input_positions="gated",
        options={**_SINUSOID, "max_distance": "fusion"},
        defaults=_clipped_default,
    ),
}
#: Methods that run block-local (`attention_window`): all of them (the
#: forgetting gate gives its bias on the band, CoPE counts over the band).
LOCAL_METHODS = tuple(METHODS)
#: Methods that run LSH attention (`attention_type="lsh"`): the block-local
#: ones but the recursive blocks, whose two attentions are their own, the
#: forgetting gate (a per-example bias on every pair) and CoPE (a count
#: over the keys in text order, which LSH's chunks do not keep).
LSH_METHODS = tuple(
    name
    for name, method in METHODS.items()
    if not (method.recursive or method.forgetting_gate or method.contextual)
)
#: Methods whose attentions can share one bias (`share_position_bias=True`).
SHARED_BIAS_METHODS = tuple(name for name, method in METHODS.items() if method.bias)


def rounding_modelled(method):
    """Whether every layer of `method` models its int8 rounding (QAT).

    All but the forgetting gate and contextual positions, whose cumulative
    sums, logarithms and floors have no int8 kernels (they export at
    float32 only).
    """
    return not method.forgetting_gate and not method.contextual


#: The methods whose every layer models its int8 rounding (`quantize=True`).
QUANTIZED_METHODS = tuple(
    name for name, method in METHODS.items() if rounding_modelled(method)
)
