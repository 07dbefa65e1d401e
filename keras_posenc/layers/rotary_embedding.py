"""Rotary position embedding: RoPE, its context-extension scalings, xPos, N-D."""

import numpy as np

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import add_float32_weight, keras, rank, register
from keras_posenc.layers import _rope_checks
from keras_posenc.layers._positions import resolve_positions, to_coordinates
from keras_posenc.ops import rotary

SIDES = ("query", "key")


@register
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding: rotates feature pairs by `p * theta_i`.

    For a token at position `p`, slot `i < r/2` rotates the feature pair
    `(x_i, x_{i+r/2})` (rotate-half, HF transformers and keras-hub) or
    `(x_{2i}, x_{2i+1})` (`interleaved`, RoFormer and GPT-J) by the angle
    `p * theta_i`, `theta_i = base^(-2i/r)`, and multiplies cos and sin by
    the type's attention factor; features past `rotary_dim` pass unchanged.
    Then `<rope(q, m), rope(k, n)>` depends only on `m - n`. Inputs are
    `(B, T, H)` or `(B, T, N, H)` (sequence on axis 1); angles, cos and sin
    are float32, cast at the end (mixed precision cannot break them).

    `rope_type` changes the frequencies for contexts longer than training
    (`keras_posenc.utils.set_rope_scaling` switches a trained model), with
    s = `scaling_factor`, L0 = `original_max_position_embeddings` and L the
    current length (largest position + 1): `"linear"` theta/s; `"ntk"` base
    `base s^(r/(r-2))`; `"dynamic"` base `base (s L/L0 - (s-1))^(r/(r-2))`
    once L > L0; `"yarn"` a ramp between theta and theta/s (`beta_fast`,
    `beta_slow`), cos and sin times `0.1 ln(s) + 1`; `"llama3"` theta/s for
    low frequencies, theta for high ones, blended between; `"longrope"`
    theta/`short_factor` (past L0 `long_factor`), factor
    `sqrt(1 + ln(s)/ln(L0))`; `"proportional"` (p-RoPE, Gemma 4) theta/s on
    the first `partial_rotary_factor` of the slots, 0 on the rest. The
    formulas live in `keras_posenc.ops.rotary`.

    xPos (`xpos_scale_base`) scales slot `i` by `zeta_i^(+-p / base)` for
    queries / keys (`side=`): logits decay as `zeta^((m - n) / base)` (for
    causal attention). `coordinate_dim=C` takes C coordinates per position:
    axial (slots split evenly, each coordinate its own spectrum), M-RoPE
    with `sections` (slot section c turns with coordinate c: equal
    coordinates give 1-D RoPE; `interleaved_sections` spreads each section
    round-robin over the spectrum, Qwen3-VL's layout), or RoPE-Mixed with
    `learned_frequencies` (a trained per-head `(N, C, r/2)` matrix, starting
    axial).

    Args:
        max_wavelength: float, the base. Defaults to `10000.0`.
        rotary_dim: int, the even number r of rotated features, at most H.
            Defaults to `None` (H).
        interleaved: bool, pair features `(2i, 2i+1)`. Defaults to `False`.
        rope_type: str, one of `ops.rotary.ROPE_TYPES`. Defaults to `"default"`.
        scaling_factor: float, s >= 1. Defaults to `1.0`.
        original_max_position_embeddings: int, L0, the training context.
            Defaults to `None`.
        rope_parameters: dict, the type's other parameters, as
            `ops.rotary.ROPE_TYPES` lists them (`beta_fast`, `short_factor`,
            `partial_rotary_factor`, ...). Defaults to `None`.
        xpos_scale_base: float, xPos' scale base (e.g. 512), or None (off);
            positions past `max_position` (~64x the base, where the scales
            leave float32) are refused. Defaults to `None`.
        coordinate_dim: int, C coordinates per position. Defaults to `1`.
        grid_shape: tuple of C ints, a row-major grid of flat token indices.
            Defaults to `None`.
        sections: tuple of C ints summing to r/2 (M-RoPE). Defaults to `None`.
        learned_frequencies: bool, trained frequencies. Defaults to `False`.
        interleaved_sections: bool, Qwen3-VL's M-RoPE layout: sections dealt
            round-robin over the slots (`ops.rotary.section_owners`); needs
            `sections`. Defaults to `False`.

    Call arguments:
        inputs: tensor `(B, T, H)` or `(B, T, N, H)`.
        start_index: int or scalar tensor, the first position. Defaults to `0`.
        positions: optional `(T,)`, `(B, T)`, `(T, C)` or `(B, T, C)`.
        side: `"query"` or `"key"`, required with xPos. Defaults to `None`.

    Returns:
        The rotated tensor, shaped as `inputs`.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> rope = keras_posenc.RotaryEmbedding()
    >>> rope(tf.ones((2, 5, 4, 8))).shape
    TensorShape([2, 5, 4, 8])

    References:
        - [Su et al., 2021 (RoFormer)](https://arxiv.org/abs/2104.09864)
        - [Chen et al., 2023 (position interpolation)](https://arxiv.org/abs/2306.15595)
        - [NTK-aware scaling, 2023](https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/)
        - [Peng et al., 2023 (YaRN)](https://arxiv.org/abs/2309.00071)
        - [Llama 3.1, 2024](https://arxiv.org/abs/2407.21783)
        - [Ding et al., 2024 (LongRoPE)](https://arxiv.org/abs/2402.13753)
        - [Sun et al., 2022 (xPos)](https://arxiv.org/abs/2212.10554)
        - [Heo et al., 2024 (RoPE-Mixed)](https://arxiv.org/abs/2403.13298)
        - [Wang et al., 2024 (Qwen2-VL M-RoPE)](https://arxiv.org/abs/2409.12191)
        - [Bai et al., 2025 (Qwen3-VL interleaved M-RoPE)](https://arxiv.org/abs/2511.21631)
    """

    def __init__(
        self,
        max_wavelength=10000.0,
        rotary_dim=None,
        interleaved=False,
        rope_type="default",
        scaling_factor=1.0,
        original_max_position_embeddings=None,
        rope_parameters=None,
        xpos_scale_base=None,
        coordinate_dim=1,
        grid_shape=None,
        sections=None,
        learned_frequencies=False,
        interleaved_sections=False,
        **kwargs,
    ):
        max_wavelength = _checks.positive_float("max_wavelength", max_wavelength)
        rotary_dim = _checks.positive_int("rotary_dim", rotary_dim, allow_none=True)
        if rotary_dim is not None and rotary_dim % 2:
            _checks.fail("rotary_dim", "an even integer >= 2", rotary_dim)
        interleaved = _checks.boolean("interleaved", interleaved)
        scaling = _rope_checks.rope_scaling(
            rope_type, scaling_factor, original_max_position_embeddings, rope_parameters
        )
        if xpos_scale_base is not None:
            xpos_scale_base = _checks.positive_float("xpos_scale_base", xpos_scale_base)
        coordinate_dim, grid_shape, sections, learned_frequencies = (
            _rope_checks.coordinates(
                coordinate_dim,
                grid_shape,
                sections,
                learned_frequencies,
                rotary_dim,
                rope_type,
                xpos_scale_base,
            )
        )
        interleaved_sections = _rope_checks.interleaved_sections(
            interleaved_sections, sections
        )
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength
        self.rotary_dim = rotary_dim
        self.interleaved = interleaved
        self.rope_type = rope_type
        self.scaling_factor = scaling.scaling_factor
        self.original_max_position_embeddings = scaling.original_max_position_embeddings
        self.rope_parameters = scaling.rope_parameters
        self.xpos_scale_base = xpos_scale_base
        self.coordinate_dim = coordinate_dim
        self.grid_shape = grid_shape
        self.sections = sections
        self.learned_frequencies = learned_frequencies
        self.interleaved_sections = interleaved_sections
        self.supports_masking = True

    def build(self, input_shape):
        head_size = _checks.known_width(input_shape)
        self._width = _rope_checks.rotary_width(
            self.rotary_dim,
            head_size,
            self.coordinate_dim,
            self.sections,
            self.rope_parameters,
            self.rope_type,
        )
        if self.learned_frequencies:
            heads = input_shape[2] if len(input_shape) == 4 else 1
            shape = (heads, self.coordinate_dim, self._width // 2)
            start = np.broadcast_to(self.frequency_matrix(), shape)
            self.frequencies = add_float32_weight(
                self,
                name="frequencies",
                shape=start.shape,
                initializer=keras.initializers.Constant(np.array(start)),
            )
        self.built = True

    def call(self, inputs, start_index=0, positions=None, side=None):
        positions = self.resolve(inputs, start_index, positions)
        cos, sin = self.cos_sin(positions, side)  # (..., T, [N,] r/2)
        if rank(inputs) == 4 and not self.learned_frequencies:
            cos, sin = cos[..., None, :], sin[..., None, :]  # a heads axis
        return ops.rotary.rotate(inputs, cos, sin, self.interleaved)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "rotary_dim": self.rotary_dim,
                "interleaved": self.interleaved,
                "rope_type": self.rope_type,
                "scaling_factor": self.scaling_factor,
                "original_max_position_embeddings": (
                    self.original_max_position_embeddings
                ),
                "rope_parameters": dict(self.rope_parameters),
                "xpos_scale_base": self.xpos_scale_base,
                "coordinate_dim": self.coordinate_dim,
                "grid_shape": self.grid_shape,
                "sections": self.sections,
                "learned_frequencies": self.learned_frequencies,
                "interleaved_sections": self.interleaved_sections,
            }
        )
        return config

    def resolve(self, inputs, start_index=0, positions=None):
        """Float32 positions `(..., T, C)` of the tokens of `inputs`."""
        ranks = (1, 2) if self.coordinate_dim == 1 or self.grid_shape else (2, 3)
        positions = resolve_positions(inputs, start_index, positions, ranks)
        return to_coordinates(positions, self.coordinate_dim, self.grid_shape)

    def cos_sin(self, positions, side=None, length=None):
        """Float32 cos and sin `(..., T, r/2)` (`(..., T, N, r/2)` when learned).

        `length` is the current length L of length-dependent types (default:
        the largest position + 1).
        """
        if self.xpos_scale_base is not None and side not in SIDES:
            _checks.fail("side", f"one of {SIDES} with xPos", side)
        if self.learned_frequencies:
            angles = xp.tensordot(positions, self.frequencies, [[-1], [1]])
        else:
            if length is None and rotary.ROPE_TYPES[self.rope_type].length_dependent:
                length = xp.reduce_max(positions) + 1.0  # the current length L
            matrix = self.frequency_matrix(length)  # (C, r/2)
            angles = xp.reduce_sum(positions[..., None] * matrix, axis=-2)
        factor = self.attention_factor
        cos, sin = xp.cos(angles) * factor, xp.sin(angles) * factor
        if self.xpos_scale_base is not None:
            self._check_xpos_range(positions)
            scale = rotary.xpos_scale(
                self._width, positions[..., 0], self.xpos_scale_base
            )
            scale = scale if side == "query" else 1.0 / scale
            cos, sin = cos * scale, sin * scale
        return cos, sin

    @property
    def max_position(self):
        """The first position xPos cannot scale in float32 (None without xPos)."""
        if self.xpos_scale_base is None:
            return None
        return rotary.xpos_max_position(self.xpos_scale_base)

    def _check_xpos_range(self, positions):
        """Positions known before running must stay below `max_position`."""
        value = xp.get_static_value(positions)
        if value is not None and value.size and value.max() >= self.max_position:
            raise ValueError(
                f"`positions` must stay below max_position={self.max_position} "
                f"with xpos_scale_base={self.xpos_scale_base}: xPos' scales leave "
                f"float32 there (NaN logits). Received: a position {value.max():.0f}."
                " Use a larger xpos_scale_base, or rotary without xPos"
            )

    @property
    def attention_factor(self):
        """The factor on cos and sin (on both sides: the logits get its square)."""
        return rotary.rope_attention_factor(self.rope_type, self._rope_parameters())

    @property
    def position_only(self):
        """Whether cos and sin depend on a 1-D position alone (so can be tabulated)."""
        dependent = rotary.ROPE_TYPES[self.rope_type].length_dependent
        return self.coordinate_dim == 1 and not self.grid_shape and not dependent

    @property
    def rotary_width(self):
        """r, the number of rotated features (known once built)."""
        return self._width if self.built else self.rotary_dim

    def frequency_matrix(self, length=None):
        """`(C, r/2)`: the inverse frequency of each slot for each coordinate."""
        r, c = self._width, self.coordinate_dim
        parameters = self._rope_parameters()
        return rotary.frequency_matrix(
            self.rope_type,
            r,
            self.max_wavelength,
            parameters,
            c,
            self.sections,
            length,
            self.interleaved_sections,
        )

    def _rope_parameters(self):
        """The type's parameters with defaults filled in."""
        shared = (self.scaling_factor, self.original_max_position_embeddings)
        return rotary.rope_parameters(self.rope_type, self.rope_parameters, *shared)
