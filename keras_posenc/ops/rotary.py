"""Rotary position embedding (RoPE): the frequencies of every scaling, the rotation.

`ROPE_TYPES` is the table of context-extension scalings (and p-RoPE's
partial rotation, `"proportional"`), each from its paper with HF
transformers' conventions (ported weights match): its parameters, how it
changes the inverse frequencies `base^(-2i/r)` (some read the current length L,
the largest position + 1) and its factor on cos and sin. Frequencies that
ignore L are NumPy constants, which an export keeps as constants.
"""

import dataclasses
import math

import numpy as np

from keras_posenc._backend import xp
from keras_posenc.ops._rotate import (  # noqa: F401 (public: ops.rotary.*)
    rotate,
    rotate_widened,
    rotation_tables,
)


def default_inverse_frequencies(rotary_dim, max_wavelength=10000.0):
    """`base^(-2i/r)` for `i < r/2`, float64 NumPy `(r/2,)`."""
    return max_wavelength ** -(np.arange(0, rotary_dim, 2.0) / rotary_dim)


def _linear(inv, r, base, p, length):
    return inv / p["scaling_factor"]


def _ntk(inv, r, base, p, length):
    return default_inverse_frequencies(r, base * p["scaling_factor"] ** (r / (r - 2)))


def _dynamic(inv, r, base, p, length):
    s, original = p["scaling_factor"], p["original_max_position_embeddings"]
    length = original if length is None else length  # None: within training
    ratio = s * xp.cast(length, xp.float32) / original - (s - 1.0)
    ratio = xp.maximum(ratio, 1.0)  # unchanged while L <= L0
    log_base = math.log(base) + (r / (r - 2)) * xp.math.log(ratio)
    exponents = xp.constant(np.arange(0, r, 2) / r, xp.float32)
    return xp.exp(-exponents * log_base)


def _yarn(inv, r, base, p, length):
    s, original = p["scaling_factor"], p["original_max_position_embeddings"]

    def correction_dim(rotations):
        return r * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(p["beta_fast"]), correction_dim(p["beta_slow"])
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high = high + 0.001  # no division by zero
    ramp = np.clip((np.arange(r // 2) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1: original frequency (fast), 0: interpolated (slow)
    return inv / s * (1.0 - keep) + inv * keep


def _llama3(inv, r, base, p, length):
    s, original = p["scaling_factor"], p["original_max_position_embeddings"]
    low, high = p["low_freq_factor"], p["high_freq_factor"]
    wavelength = 2 * math.pi / inv
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1.0 - smooth) * inv / s + smooth * inv
    scaled = np.where(wavelength > original / low, inv / s, inv)
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return np.where(medium, smoothed, scaled)


def _longrope(inv, r, base, p, length):
    original = p["original_max_position_embeddings"]
    length = original if length is None else length  # None: within training
    long = xp.constant(p["long_factor"], xp.float32)
    short = xp.constant(p["short_factor"], xp.float32)
    factors = xp.where(xp.cast(length, xp.float32) > original, long, short)
    return xp.constant(inv, xp.float32) / factors


def _proportional(inv, r, base, p, length):
    """p-RoPE: the first `partial_rotary_factor` of the slots turn (their
    frequencies over the whole width r, divided by s), the rest stay still."""
    turning = int(p["partial_rotary_factor"] * r // 2)
    kept = np.arange(r // 2) < turning
    return np.where(kept, inv / p["scaling_factor"], 0.0)


def _yarn_attention(p):
    if p["attention_factor"] is not None:
        return p["attention_factor"]
    s = p["scaling_factor"]
    return 0.1 * math.log(s) + 1.0 if s > 1 else 1.0


def _longrope_attention(p):
    if p["attention_factor"] is not None:
        return p["attention_factor"]
    s, original = p["scaling_factor"], p["original_max_position_embeddings"]
    return math.sqrt(1 + math.log(s) / math.log(original)) if s > 1 else 1.0


@dataclasses.dataclass(frozen=True)
class RopeType:
    """One scaling: its parameters, frequency rule and attention factor.

    Attributes:
        required: parameter names that must be given.
        defaults: `{name: default}` of the optional parameters.
        frequencies: `(inv, r, base, params, length) -> (r/2,)`, NumPy when
            the type ignores `length`, a float32 tensor otherwise.
        length_dependent: bool, whether `frequencies` reads the current length.
        length_exponential: bool, whether `frequencies` takes an exponential
            of the current length (an EXP at run time when decoding).
        attention_factor: `params -> float`, the factor on cos and sin.
    """

    required: tuple = ()
    defaults: dict = dataclasses.field(default_factory=dict)
    frequencies: object = None
    length_dependent: bool = False
    length_exponential: bool = False
    attention_factor: object = None


_SCALED = ("scaling_factor",)
_EXTENDED = ("scaling_factor", "original_max_position_embeddings")

#: Every `rope_type`, by name.
ROPE_TYPES = {
    "default": RopeType(),
    "linear": RopeType(required=_SCALED, frequencies=_linear),
    "ntk": RopeType(required=_SCALED, frequencies=_ntk),
    "dynamic": RopeType(
        required=_EXTENDED,
        frequencies=_dynamic,
        length_dependent=True,
        length_exponential=True,
    ),
    "yarn": RopeType(
        required=_EXTENDED,
        defaults={
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "attention_factor": None,
            "truncate": True,
        },
        frequencies=_yarn,
        attention_factor=_yarn_attention,
    ),
    "llama3": RopeType(
        required=_EXTENDED,
        defaults={"low_freq_factor": 1.0, "high_freq_factor": 4.0},
        frequencies=_llama3,
    ),
    "proportional": RopeType(
        defaults={"partial_rotary_factor": 1.0},
        frequencies=_proportional,
    ),
    "longrope": RopeType(
        required=_EXTENDED + ("short_factor", "long_factor"),
        defaults={"attention_factor": None},
        frequencies=_longrope,
        length_dependent=True,
        attention_factor=_longrope_attention,
    ),
}


def rope_frequencies(rope_type, rotary_dim, max_wavelength, params, length=None):
    """Inverse frequencies `(r/2,)` of `rope_type` (float32 tensor).

    Args:
        rope_type: str, a key of `ROPE_TYPES`.
        rotary_dim: int, the even rotary width r.
        max_wavelength: float, the base.
        params: dict, the type's parameters with defaults filled in.
        length: scalar tensor L (largest position + 1), for length-dependent
            types.
    """
    record = ROPE_TYPES[rope_type]
    inv = default_inverse_frequencies(rotary_dim, max_wavelength)
    if record.frequencies is not None:
        inv = record.frequencies(inv, rotary_dim, max_wavelength, params, length)
    return xp.cast(inv, xp.float32)


def rope_parameters(rope_type, given, scaling_factor, original_max_position_embeddings):
    """The parameters of `rope_type`: its defaults, then `given`, then both shared."""
    return dict(
        ROPE_TYPES[rope_type].defaults,
        **given,
        scaling_factor=scaling_factor,
        original_max_position_embeddings=original_max_position_embeddings,
    )


def frequency_matrix(
    rope_type,
    rotary_dim,
    max_wavelength,
    params,
    coordinates=1,
    sections=None,
    length=None,
    interleaved_sections=False,
):
    """Float32 `(C, r/2)`: the inverse frequency of each slot for each coordinate.

    One coordinate: the type's frequencies. `sections` (M-RoPE): the full
    spectrum, slot `i` owned by the coordinate whose section holds it
    (`section_owners`). Otherwise axial: each coordinate owns r/(2C)
    consecutive slots with the spectrum of a rotary width r/C.
    """
    half = rotary_dim // 2
    if coordinates == 1 or sections:
        inv = rope_frequencies(rope_type, rotary_dim, max_wavelength, params, length)
        if coordinates == 1:
            return inv[None]
        owner = section_owners(sections, interleaved_sections)  # slot -> coordinate
        mine = np.arange(coordinates)[:, None] == owner[None]
        return xp.constant(mine, xp.float32) * inv
    per = half // coordinates
    inv = rope_frequencies(rope_type, 2 * per, max_wavelength, params)
    rows = [
        xp.pad(inv, [[k * per, (coordinates - 1 - k) * per]])
        for k in range(coordinates)
    ]
    return xp.stack(rows)


def section_owners(sections, interleaved=False):
    """`(r/2,)` ints: the coordinate that turns each slot under M-RoPE.

    Chunked (Qwen2-VL): coordinate c owns `sections[c]` consecutive slots.
    Interleaved (Qwen3-VL): slots go round-robin, slot i to coordinate
    `c = i mod C` while `i < C * sections[c]` (c >= 1); every other slot is
    coordinate 0's (time), so each coordinate still owns `sections[c]` slots
    but spread over the whole spectrum.
    """
    if not interleaved:
        return np.repeat(np.arange(len(sections)), sections)
    count = len(sections)
    owner = np.zeros(sum(sections), np.int64)
    for c in range(1, count):
        owner[c : count * sections[c] : count] = c
    return owner


def rope_attention_factor(rope_type, params):
    """The factor on cos and sin of `rope_type` (1.0 for most types)."""
    record = ROPE_TYPES[rope_type]
    return 1.0 if record.attention_factor is None else record.attention_factor(params)


#: The largest |exponent| of an xPos scale: e^80 and e^-80 both stay finite and
#: normal in float32 (e^88.7 overflows), so a query scale times a key scale
#: keeps its meaning.
XPOS_MAX_EXPONENT = 80.0


def xpos_max_position(scale_base, gamma=0.4):
    """The first position whose xPos scales leave float32's safe range.

    The steepest slot has `zeta_0 = gamma / (1 + gamma)`; past this position
    its key scale `zeta_0^(-n / scale_base)` would overflow (NaN logits).
    """
    steepest = -math.log(gamma / (1 + gamma))
    return int(XPOS_MAX_EXPONENT * scale_base / steepest)


def xpos_scale(rotary_dim, positions, scale_base, gamma=0.4):
    """xPos scales `zeta_i^(n / scale_base)`, float32 `(..., T, r/2)`.

    `zeta_i = (2i/r + gamma) / (1 + gamma)`; keys use the inverse, so the
    query-key product decays as `zeta^((n - m) / scale_base)`.
    """
    zeta = (np.arange(0, rotary_dim, 2) / rotary_dim + gamma) / (1 + gamma)
    exponent = xp.cast(positions, xp.float32)[..., None] / scale_base  # (..., T, 1)
    return xp.exp(exponent * xp.constant(np.log(zeta), xp.float32))


def turned_logits(q, keys, cos, sin, interleaved=False):
    """Logits `(B, N, T, S)` of queries turned by their distance to each key.

    `q` `(B, T, N, H)` unturned queries, `keys` `(B, N, S, H)` unturned
    cached keys (heads-first, as the cache holds them), `cos`, `sin`
    `(T, S, r/2)` of the distances `i - j` (scaled as the logits need):
    rotations compose, `R_i q . R_j k = R_(i-j) q . k`, so the keys are only
    read. One query token uses 4-D tensors only (microcontrollers).
    """
    q = xp.transpose(q, [0, 2, 1, 3])  # (B, N, T, H)
    width = 2 * cos.shape[-1]  # r: the features past it are not turned
    rest = None
    if q.shape[-1] > width:
        rest = xp.matmul(q[..., width:], keys[..., width:], transpose_b=True)
        q, keys = q[..., :width], keys[..., :width]
    if q.shape[2] == 1:
        turned = rotate(q, cos[0], sin[0], interleaved)  # (B, N, S, r)
        logits = xp.reduce_sum(turned * keys, axis=-1)[:, :, None]  # (B, N, 1, S)
    else:
        turned = rotate(q[:, :, :, None], cos, sin, interleaved)  # (B, N, T, S, r)
        logits = xp.reduce_sum(turned * keys[:, :, None], axis=-1)
    return logits if rest is None else logits + rest
