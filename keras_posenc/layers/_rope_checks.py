"""Argument checks of `RotaryEmbedding`, shared with `utils.set_rope_scaling`,
and of a rotary layer inside a quantization-aware attention (shared with
`training.quantization`)."""

import numbers
from typing import NamedTuple

from keras_posenc import _checks
from keras_posenc.ops.rotary import ROPE_TYPES


class Scaling(NamedTuple):
    """A checked context scaling of `RotaryEmbedding`."""

    scaling_factor: float
    original_max_position_embeddings: int
    rope_parameters: dict


def rope_scaling(rope_type, scaling_factor, original_max_position_embeddings, params):
    """Checks a scaling; returns it validated, as a `Scaling`.

    `params` are the type's other parameters (`rope_parameters`): only names
    the type takes, each required one present.
    """
    _checks.choice("rope_type", rope_type, tuple(ROPE_TYPES))
    record = ROPE_TYPES[rope_type]
    if isinstance(scaling_factor, bool) or not isinstance(scaling_factor, numbers.Real):
        _checks.fail("scaling_factor", "a number >= 1", scaling_factor, error=TypeError)
    if not 1.0 <= scaling_factor < float("inf"):
        _checks.fail(
            "scaling_factor",
            "a finite number >= 1 (it extends the context)",
            scaling_factor,
        )
    original = _checks.positive_int(
        "original_max_position_embeddings",
        original_max_position_embeddings,
        allow_none=True,
    )
    if params is not None and not isinstance(params, dict):
        _checks.fail("rope_parameters", "a dict or None", params, error=TypeError)
    params = dict(params or {})
    allowed = set(record.defaults) | (set(record.required) - {"scaling_factor"})
    allowed.discard("original_max_position_embeddings")
    unknown = sorted(set(params) - allowed)
    if unknown:
        _checks.fail(
            "rope_parameters",
            f"a dict with keys among {sorted(allowed)} for rope_type={rope_type!r}",
            params,
        )
    _check_type_parameters(rope_type, dict(record.defaults, **params))
    given = dict(params, scaling_factor=scaling_factor)
    given["original_max_position_embeddings"] = original
    for name in record.required:
        if given.get(name) is None:
            _checks.fail(
                name,
                f"given for rope_type={rope_type!r}",
                None,
                fix=f"rope_type={rope_type!r} needs {list(record.required)}",
            )
    return Scaling(float(scaling_factor), original, params)


def _positive(name, value, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _checks.fail(name, "a finite number > 0", value, error=TypeError)
    if not 0 < value < float("inf"):
        _checks.fail(name, "a finite number > 0", value)


def _check_type_parameters(rope_type, params):
    """Ranges of the type's own parameters (each would break the frequencies)."""
    for name in ("beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor"):
        if name in params:
            _positive(name, params[name])
    if "attention_factor" in params:
        _positive("attention_factor", params["attention_factor"], allow_none=True)
    if "truncate" in params:
        _checks.boolean("truncate", params["truncate"])
    fraction = params.get("partial_rotary_factor", 1.0)
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, numbers.Real)
        or not (0.0 <= fraction <= 1.0)
    ):
        _checks.fail("partial_rotary_factor", "a number in [0, 1]", fraction)
    for low, high in (
        ("beta_slow", "beta_fast"),
        ("low_freq_factor", "high_freq_factor"),
    ):
        if low in params and high in params and not params[high] > params[low]:
            _checks.fail(
                high,
                f"greater than {low}={params[low]} for rope_type={rope_type!r}",
                params[high],
            )


def factor_lists(params, half):
    """LongRoPE's `short_factor` / `long_factor` must hold r/2 numbers > 0."""
    for name in ("short_factor", "long_factor"):
        if name not in params:
            continue
        value = params[name]
        try:
            numbers_ok = len(value) == half and all(float(v) > 0 for v in value)
        except TypeError:
            numbers_ok = False
        if not numbers_ok:
            _checks.fail(name, f"a list of rotary_dim / 2 = {half} numbers > 0", value)


def sections(value, coordinate_dim, half=None):
    """M-RoPE sections: `coordinate_dim` positive ints summing to r/2."""
    if value is None:
        return None
    value = tuple(_checks.positive_int("sections", s) for s in value)
    if len(value) != coordinate_dim:
        _checks.fail("sections", f"of length coordinate_dim={coordinate_dim}", value)
    if half is not None and sum(value) != half:
        _checks.fail("sections", f"summing to rotary_dim / 2 = {half}", value)
    return value


def interleaved_sections(value, sections_):
    """Interleaved M-RoPE needs sections each of whose slots fit in r/2."""
    value = _checks.boolean("interleaved_sections", value)
    if value and sections_ is None:
        _checks.fail("interleaved_sections", "False without sections=...", value)
    if value:
        count, half = len(sections_), sum(sections_)
        for c, size in enumerate(sections_[1:], start=1):
            if c + count * (size - 1) >= half:
                _checks.fail(
                    "sections",
                    f"interleavable: coordinate {c}'s {size} slots c + {count}k "
                    f"must stay below r/2 = {half}",
                    sections_,
                )
    return value


def coordinates(
    coordinate_dim, grid_shape, sections_, learned, rotary_dim, rope_type, xpos
):
    """Checks the N-D arguments; returns them validated."""
    coordinate_dim = _checks.positive_int("coordinate_dim", coordinate_dim)
    grid_shape = _checks.grid_shape(grid_shape, coordinate_dim)
    half = None if rotary_dim is None else rotary_dim // 2
    sections_ = sections(sections_, coordinate_dim, half)
    learned = _checks.boolean("learned_frequencies", learned)
    length_dependent = ROPE_TYPES[rope_type].length_dependent
    if coordinate_dim > 1 and (xpos or length_dependent):
        _checks.fail(
            "coordinate_dim",
            "1 with xPos or a length-dependent rope_type ('dynamic', 'longrope')",
            coordinate_dim,
        )
    if learned and length_dependent:
        _checks.fail(
            "learned_frequencies",
            f"False with the length-dependent rope_type={rope_type!r}",
            learned,
        )
    return coordinate_dim, grid_shape, sections_, learned


def rotary_width(
    rotary_dim, head_size, coordinate_dim, sections_, params, rope_type="default"
):
    """r, checked against the head size H once it is known (at build)."""
    r = rotary_dim or head_size
    if r % 2 or r > head_size:
        _checks.fail("rotary_dim", f"even and <= the head size {head_size}", r)
    if r == 2 and rope_type in ("ntk", "dynamic"):  # their base has r / (r - 2)
        _checks.fail(
            "rotary_dim",
            f">= 4 for rope_type={rope_type!r} (its base is raised to r / (r - 2))",
            r,
        )
    sections(sections_, coordinate_dim, r // 2)
    factor_lists(params, r // 2)
    if coordinate_dim > 1 and not sections_ and (r // 2) % coordinate_dim:
        _checks.fail(
            "rotary_dim",
            f"such that r/2 splits evenly over {coordinate_dim} axes",
            r,
            fix="Pass sections=... for an uneven split",
        )
    return r


def rotary_rounding_problems(rotary, key_dim):
    """Why `quantize=True` cannot model the int8 rounding of `rotary` ([] if it can).

    It models one table of cos and sin per position on a range known before
    training (xPos' key tables: learned from them): a 1-D position-only type
    (no length-dependent frequencies, grid or learned frequencies) turning
    every feature of a head.
    """
    problems = []
    if not rotary.position_only or rotary.learned_frequencies:
        problems.append(
            f"rope_type={rotary.rope_type!r}, coordinate_dim="
            f"{rotary.coordinate_dim}, learned_frequencies="
            f"{rotary.learned_frequencies} (cos and sin must depend on a 1-D "
            "position alone)"
        )
    if rotary.rotary_dim not in (None, key_dim):
        problems.append(
            f"rotary_dim={rotary.rotary_dim} (must rotate all key_dim={key_dim} "
            "features)"
        )
    return problems


def check_quantized_rotary(rotary, key_dim):
    problems = rotary_rounding_problems(rotary, key_dim)
    if problems:
        _checks.fail(
            "quantize",
            "False with a rotary layer whose int8 rounding is not modelled",
            True,
            fix="The rotary layer has " + "; ".join(problems),
        )
