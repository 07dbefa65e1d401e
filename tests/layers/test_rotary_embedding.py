import math

import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import RotaryEmbedding

H = 8
LONG = {"short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 5.0, 8.0]}


def default_inv(r, base=10000.0):
    return np.array([base ** (-2 * i / r) for i in range(r // 2)])


def oracle_frequencies(rope_type, r, s=1.0, l0=None, length=None, **p):
    """`(inverse frequencies, attention factor)` written from each paper."""
    inv = default_inv(r)
    if rope_type == "default":
        return inv, 1.0
    if rope_type == "linear":
        return inv / s, 1.0
    if rope_type == "ntk":
        return default_inv(r, 10000.0 * s ** (r / (r - 2))), 1.0
    if rope_type == "dynamic":
        if length <= l0:
            return inv, 1.0
        return default_inv(
            r, 10000.0 * (s * length / l0 - (s - 1)) ** (r / (r - 2))
        ), 1.0
    if rope_type == "yarn":
        fast, slow = p.get("beta_fast", 32.0), p.get("beta_slow", 1.0)

        def dim_of(rotations):  # the dimension that turns `rotations` times in l0
            return (
                r * math.log(l0 / (rotations * 2 * math.pi)) / (2 * math.log(10000.0))
            )

        low, high = (
            max(math.floor(dim_of(fast)), 0),
            min(math.ceil(dim_of(slow)), r - 1),
        )
        out = []
        for i, f in enumerate(inv):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            out.append(f / s * ramp + f * (1 - ramp))
        return np.array(out), 0.1 * math.log(s) + 1
    if rope_type == "llama3":
        low, high = p.get("low_freq_factor", 1.0), p.get("high_freq_factor", 4.0)
        out = []
        for f in inv:
            wavelength = 2 * math.pi / f
            if wavelength < l0 / high:
                out.append(f)
            elif wavelength > l0 / low:
                out.append(f / s)
            else:
                smooth = (l0 / wavelength - low) / (high - low)
                out.append((1 - smooth) * f / s + smooth * f)
        return np.array(out), 1.0
    if rope_type == "proportional":  # p-RoPE: the first slots turn, r/2 wide
        turning = int(p.get("partial_rotary_factor", 1.0) * r // 2)
        return np.array([f / s if i < turning else 0.0 for i, f in enumerate(inv)]), 1.0
    if rope_type == "longrope":
        factors = p["long_factor"] if length > l0 else p["short_factor"]
        return inv / np.array(factors), math.sqrt(1 + math.log(s) / math.log(l0))
    raise AssertionError(rope_type)


def oracle_rope(x, positions, inv, factor=1.0, interleaved=False):
    """Rotates `x` `(B, T, H)` token by token, pair by pair."""
    out = np.array(x, dtype=np.float64)
    half = len(inv)
    for t, p in enumerate(positions):
        for i in range(half):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
            c, s = math.cos(p * inv[i]) * factor, math.sin(p * inv[i]) * factor
            out[:, t, a] = x[:, t, a] * c - x[:, t, b] * s
            out[:, t, b] = x[:, t, b] * c + x[:, t, a] * s
    return out


CASES = [
    ("default", {}, 10),
    ("linear", {"scaling_factor": 4.0}, 10),
    ("ntk", {"scaling_factor": 4.0}, 10),
    ("dynamic", {"scaling_factor": 2.0, "original_max_position_embeddings": 16}, 10),
    ("dynamic", {"scaling_factor": 2.0, "original_max_position_embeddings": 6}, 10),
    ("yarn", {"scaling_factor": 8.0, "original_max_position_embeddings": 64}, 10),
    ("llama3", {"scaling_factor": 8.0, "original_max_position_embeddings": 64}, 10),
    ("longrope", {"scaling_factor": 4.0, "original_max_position_embeddings": 16}, 10),
    ("longrope", {"scaling_factor": 4.0, "original_max_position_embeddings": 6}, 10),
    ("proportional", {"scaling_factor": 2.0}, 10),
]
#: p-RoPE's share of turning slots (`"proportional"` above turns them all).
PROPORTION = {"partial_rotary_factor": 0.25}


@pytest.mark.parametrize("rope_type,kwargs,length", CASES)
def test_every_rope_type_matches_the_numpy_oracle(rope_type, kwargs, length):
    params = dict(LONG) if rope_type == "longrope" else {}
    params = dict(PROPORTION) if rope_type == "proportional" else params
    layer = RotaryEmbedding(rope_type=rope_type, rope_parameters=params, **kwargs)
    x = np.random.normal(size=(2, length, H)).astype("float32")
    inv, factor = oracle_frequencies(
        rope_type,
        H,
        kwargs.get("scaling_factor", 1.0),
        kwargs.get("original_max_position_embeddings"),
        length,
        **params,
    )
    want = oracle_rope(x, range(length), inv, factor)
    np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rope_type,kwargs,length", CASES)
def test_position_only_means_the_frequencies_ignore_the_length(
    rope_type, kwargs, length
):
    params = dict(LONG) if rope_type == "longrope" else {}
    layer = RotaryEmbedding(rope_type=rope_type, rope_parameters=params, **kwargs)
    scale = kwargs.get("scaling_factor", 1.0)
    start = kwargs.get("original_max_position_embeddings")
    (short, a), (long, b) = (
        oracle_frequencies(rope_type, H, scale, start, n, **params) for n in (2, 200)
    )
    assert layer.position_only == (np.allclose(short, long) and a == b)


def test_coordinates_are_not_position_only():
    assert not RotaryEmbedding(coordinate_dim=2).position_only
    assert not RotaryEmbedding(coordinate_dim=2, grid_shape=(4, 4)).position_only


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(2, 5, 3, H)).astype("float32")
    check_layer(
        lambda **kw: RotaryEmbedding(
            rope_type="yarn",
            scaling_factor=2.0,
            original_max_position_embeddings=8,
            **kw,
        ),
        x,
        tmp_path,
        num_weights=0,
        expected_output_shape=x.shape,
        fit=False,
    )


def test_layer_checks_learned_frequencies(tmp_path):
    x = np.random.normal(size=(2, 6, 3, H)).astype("float32")
    check_layer(
        lambda **kw: RotaryEmbedding(
            coordinate_dim=2, grid_shape=(2, 3), learned_frequencies=True, **kw
        ),
        x,
        tmp_path,
        num_weights=1,
        expected_output_shape=x.shape,
        fit=False,
    )


def logits(layer, length, **call):
    """`q_m . k_n` for one content vector placed at every position."""
    content = np.tile(np.random.normal(size=(1, 1, H)), (1, length, 1)).astype(
        "float32"
    )
    q = layer(content, side="query", **call).numpy()[0]
    k = layer(content, side="key", **call).numpy()[0]
    return q @ k.T


def test_logits_depend_only_on_the_distance():
    table = logits(RotaryEmbedding(), 9)
    for d in range(-8, 9):
        np.testing.assert_allclose(
            np.diagonal(table, d), np.diagonal(table, d)[0], rtol=1e-4, atol=1e-4
        )


def test_two_dimensional_logits_depend_only_on_coordinate_differences():
    layer = RotaryEmbedding(coordinate_dim=2, grid_shape=(3, 4))
    table = logits(layer, 12)
    grid = np.stack(np.meshgrid(np.arange(3), np.arange(4), indexing="ij"), -1)
    grid = grid.reshape(12, 2)
    seen = {}
    for m in range(12):
        for n in range(12):
            key = tuple(grid[m] - grid[n])
            seen.setdefault(key, table[m, n])
            np.testing.assert_allclose(table[m, n], seen[key], rtol=1e-4, atol=1e-4)


def test_mrope_with_equal_coordinates_is_one_dimensional_rope():
    x = np.random.normal(size=(2, 7, H)).astype("float32")
    positions = np.arange(3, 10)
    coordinates = np.stack([positions] * 3, axis=-1)  # text: t = h = w
    mrope = RotaryEmbedding(coordinate_dim=3, sections=(1, 1, 2))
    np.testing.assert_allclose(
        mrope(x, positions=coordinates).numpy(),
        RotaryEmbedding()(x, positions=positions).numpy(),
        atol=1e-6,
    )


def test_interleaved_mrope_matches_the_numpy_oracle():
    """Qwen3-VL's layout written out: slot i turns with h if i % 3 == 1 and
    i < 3 s_h, with w if i % 3 == 2 and i < 3 s_w, else with t."""
    sections, head = (6, 5, 5), 32
    x = np.random.normal(size=(2, 7, head)).astype("float32")
    coordinates = np.random.default_rng(1).integers(0, 40, (2, 7, 3))
    layer = RotaryEmbedding(
        coordinate_dim=3, sections=sections, interleaved_sections=True
    )
    out = layer(x, positions=coordinates).numpy()
    inv = default_inv(head)
    owner = [
        1
        if i % 3 == 1 and i < 3 * sections[1]
        else 2
        if i % 3 == 2 and i < 3 * sections[2]
        else 0
        for i in range(head // 2)
    ]
    assert [owner.count(c) for c in range(3)] == list(sections)
    want = np.empty_like(out)
    for b in range(2):
        for t in range(7):
            angles = np.array([coordinates[b, t, owner[i]] * inv[i] for i in range(16)])
            c, s = np.cos(angles), np.sin(angles)
            a, z = x[b, t, :16], x[b, t, 16:]
            want[b, t] = np.concatenate([a * c - z * s, z * c + a * s])
    np.testing.assert_allclose(out, want, atol=1e-4)
    text = np.stack([np.arange(7)] * 3, -1)  # t = h = w: 1-D RoPE
    np.testing.assert_allclose(
        layer(x, positions=text).numpy(), RotaryEmbedding()(x).numpy(), atol=1e-5
    )
    again = RotaryEmbedding.from_config(layer.get_config())
    assert again.interleaved_sections is True
    np.testing.assert_allclose(again(x, positions=coordinates).numpy(), out)


def test_axial_matches_the_numpy_oracle_per_axis():
    x = np.random.normal(size=(1, 6, H)).astype("float32")
    out = RotaryEmbedding(coordinate_dim=2, grid_shape=(2, 3))(x).numpy()
    rows, cols = np.divmod(np.arange(6), 3)
    per = default_inv(H // 2)  # each axis: its own spectrum of width r/2
    want = np.empty_like(out)
    for t in range(6):  # slots 0-1 turn with the row, slots 2-3 with the column
        angles = np.concatenate([rows[t] * per, cols[t] * per])
        c, s = np.cos(angles), np.sin(angles)
        a, b = x[0, t, :4], x[0, t, 4:]
        want[0, t] = np.concatenate([a * c - b * s, b * c + a * s])
    np.testing.assert_allclose(out, want, atol=1e-5)


def test_start_index_equals_slicing_a_longer_call():
    layer = RotaryEmbedding(rope_type="linear", scaling_factor=2.0)
    x = np.random.normal(size=(2, 10, 3, H)).astype("float32")
    full = layer(x).numpy()
    np.testing.assert_allclose(
        layer(x[:, 6:], start_index=6).numpy(), full[:, 6:], atol=1e-5
    )
    np.testing.assert_allclose(
        layer(x[:, 6:], positions=np.arange(6, 10)).numpy(), full[:, 6:], atol=1e-5
    )


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rotation_leaves_the_rest_and_layout_pairs(interleaved):
    x = np.random.normal(size=(2, 5, H)).astype("float32")
    out = RotaryEmbedding(rotary_dim=4, interleaved=interleaved)(x).numpy()
    np.testing.assert_array_equal(out[..., 4:], x[..., 4:])
    want = oracle_rope(x[..., :4], range(5), default_inv(4), interleaved=interleaved)
    np.testing.assert_allclose(out[..., :4], want, atol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_static_and_dynamic_shapes_rotate_alike_forward_and_backward(interleaved):
    # Static shapes swap the pairs with a roll, unknown ones with slices.
    x = np.random.normal(size=(2, 5, H)).astype("float32")
    layer = RotaryEmbedding(rotary_dim=6, interleaved=interleaved)
    want = oracle_rope(x[..., :6], range(5), default_inv(6), interleaved=interleaved)

    def rotated_and_gradient(inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = layer(inputs)
            loss = tf.reduce_sum(out * tf.range(H, dtype=tf.float32))
        return out, tape.gradient(loss, inputs)

    static = tf.function(rotated_and_gradient)
    dynamic = tf.function(
        rotated_and_gradient, input_signature=[tf.TensorSpec((None, None, H))]
    )
    # The rotation is orthogonal, so the gradient is the inverse rotation
    # (angles negated) of the upstream weights.
    upstream = np.broadcast_to(np.arange(H, dtype="float32"), x.shape)
    back = oracle_rope(
        upstream[..., :6],
        [-p for p in range(5)],
        default_inv(6),
        interleaved=interleaved,
    )
    for fn in (static, dynamic):
        out, grad = fn(tf.constant(x))
        np.testing.assert_allclose(out.numpy()[..., :6], want, atol=1e-5)
        np.testing.assert_array_equal(out.numpy()[..., 6:], x[..., 6:])
        np.testing.assert_allclose(grad.numpy()[..., :6], back, atol=1e-5)
        np.testing.assert_array_equal(grad.numpy()[..., 6:], upstream[..., 6:])


def test_xpos_logits_decay_with_distance_by_zeta():
    """q_m . k_n of xPos equals plain RoPE's with slot i scaled by zeta_i^((m-n)/b)."""
    x = np.random.normal(size=(1, 6, H)).astype("float32")
    xpos = RotaryEmbedding(xpos_scale_base=4.0)
    q, k = xpos(x, side="query").numpy()[0], xpos(x, side="key").numpy()[0]
    plain = RotaryEmbedding()(x).numpy()[0]
    zeta = (np.arange(0, H, 2) / H + 0.4) / 1.4
    for m in range(6):
        for n in range(6):
            scale = np.concatenate([zeta, zeta]) ** ((m - n) / 4.0)
            want = (plain[m] * scale) @ plain[n]
            np.testing.assert_allclose(q[m] @ k[n], want, rtol=1e-4, atol=1e-5)


def test_mixed_precision_keeps_large_positions_exact():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    layer = RotaryEmbedding()
    x = np.ones((1, 2, H), "float16")
    out = layer(x, positions=np.array([30000, 30001])).numpy().astype("float64")
    want = oracle_rope(np.ones((1, 2, H)), [30000, 30001], default_inv(H))
    np.testing.assert_allclose(out, want, atol=2e-3)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"rotary_dim": 5}, ValueError, "`rotary_dim` must be an even integer"),
        ({"rope_type": "ntk-by-parts"}, ValueError, "`rope_type` must be one of"),
        (
            {"rope_type": "yarn", "scaling_factor": 2.0},
            ValueError,
            "`original_max_position_embeddings` must be given for rope_type='yarn'",
        ),
        (
            {"rope_type": "linear", "scaling_factor": 0.5},
            ValueError,
            "`scaling_factor` must be a finite number >= 1",
        ),
        (
            {"rope_type": "linear", "scaling_factor": "2"},
            TypeError,
            "`scaling_factor` must be a number",
        ),
        (
            {"rope_type": "linear", "rope_parameters": {"beta_fast": 4}},
            ValueError,
            "`rope_parameters` must be a dict with keys among",
        ),
        (
            {"coordinate_dim": 2, "sections": (1, 1, 2)},
            ValueError,
            "`sections` must be of length coordinate_dim=2",
        ),
        (
            {"coordinate_dim": 2, "sections": (1, 1), "rotary_dim": 8},
            ValueError,
            r"`sections` must be summing to rotary_dim / 2 = 4",
        ),
        (
            {"interleaved_sections": True},
            ValueError,
            "`interleaved_sections` must be False without sections",
        ),
        (
            {"coordinate_dim": 3, "sections": (1, 1, 2), "interleaved_sections": True},
            ValueError,
            r"`sections` must be interleavable: coordinate 2's 2 slots",
        ),
        (
            {"interleaved_sections": 1},
            TypeError,
            "`interleaved_sections` must be a bool",
        ),
        (
            {"coordinate_dim": 2, "xpos_scale_base": 512},
            ValueError,
            "`coordinate_dim` must be 1 with xPos",
        ),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        RotaryEmbedding(**kwargs)


def test_rejects_what_only_the_head_size_reveals():
    x = tf.zeros((1, 3, H))
    with pytest.raises(ValueError, match="`rotary_dim` must be even and <= the head"):
        RotaryEmbedding(rotary_dim=10)(x)
    bad = dict(LONG, long_factor=[1.0, 2.0])
    layer = RotaryEmbedding(
        rope_type="longrope",
        scaling_factor=2.0,
        original_max_position_embeddings=4,
        rope_parameters=bad,
    )
    with pytest.raises(ValueError, match=r"`long_factor` must be a list of rotary_dim"):
        layer(x)
    with pytest.raises(ValueError, match="`sections` must be summing to rotary_dim"):
        RotaryEmbedding(coordinate_dim=2, sections=(1, 2))(x)


def test_rejects_positions_of_the_wrong_coordinate_width():
    layer = RotaryEmbedding(coordinate_dim=2)
    with pytest.raises(ValueError, match="`positions` must end in coordinate_dim=2"):
        layer(tf.zeros((1, 3, H)), positions=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="`positions` must be given as"):
        layer(tf.zeros((1, 3, H)))


def test_xpos_needs_the_side():
    with pytest.raises(ValueError, match="`side` must be one of"):
        RotaryEmbedding(xpos_scale_base=64.0)(tf.zeros((1, 3, H)))


def test_tokens_past_the_grid_are_refused():
    layer = RotaryEmbedding(coordinate_dim=2, grid_shape=(2, 3))
    with pytest.raises(
        ValueError, match=r"`positions` must be flat indices in \[0, 6\)"
    ):
        layer(tf.zeros((1, 7, H)))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"rope_type": "yarn", "rope_parameters": {"attention_factor": 0}},
            ValueError,
            "attention_factor",
        ),
        (
            {"rope_type": "yarn", "rope_parameters": {"attention_factor": -1.0}},
            ValueError,
            "attention_factor",
        ),
        (
            {"rope_type": "yarn", "rope_parameters": {"beta_fast": 0}},
            ValueError,
            "beta_fast",
        ),
        (
            {"rope_type": "yarn", "rope_parameters": {"beta_fast": -1}},
            ValueError,
            "beta_fast",
        ),
        (
            {"rope_type": "yarn", "rope_parameters": {"beta_fast": "x"}},
            TypeError,
            "beta_fast",
        ),
        (
            {
                "rope_type": "yarn",
                "rope_parameters": {"beta_fast": 1.0, "beta_slow": 2.0},
            },
            ValueError,
            "beta_fast",
        ),
        (
            {"rope_type": "yarn", "rope_parameters": {"truncate": "no"}},
            TypeError,
            "truncate",
        ),
        (
            {"rope_type": "llama3", "rope_parameters": {"low_freq_factor": 0}},
            ValueError,
            "low_freq_factor",
        ),
        (
            {"rope_type": "llama3", "rope_parameters": {"high_freq_factor": 1.0}},
            ValueError,
            "high_freq_factor",
        ),
        (
            {
                "rope_type": "proportional",
                "rope_parameters": {"partial_rotary_factor": 1.5},
            },
            ValueError,
            "`partial_rotary_factor` must be a number in \\[0, 1\\]",
        ),
    ],
)
def test_rope_type_parameters_are_range_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        RotaryEmbedding(
            scaling_factor=2.0, original_max_position_embeddings=8, **kwargs
        )


@pytest.mark.parametrize("rope_type", ["ntk", "dynamic"])
def test_ntk_bases_need_more_than_one_rotated_pair(rope_type):
    layer = RotaryEmbedding(
        rotary_dim=2,
        rope_type=rope_type,
        scaling_factor=2.0,
        original_max_position_embeddings=8,
    )
    with pytest.raises(ValueError, match="rotary_dim"):
        layer(tf.zeros((1, 3, 2, 4)))


def test_xpos_refuses_positions_its_scales_cannot_hold():
    import math

    layer = RotaryEmbedding(xpos_scale_base=512.0)
    # The steepest slot: zeta_0 = 0.4 / 1.4, so e^80 is reached at 80 b / ln 3.5.
    assert layer.max_position == int(80 * 512 / math.log(1.4 / 0.4))
    x = tf.random.normal((1, 2, 2, 8))
    with pytest.raises(ValueError, match=f"max_position={layer.max_position}"):
        layer(x, start_index=40000, side="key")
    near = layer(x, start_index=32000, side="key")
    assert np.all(np.isfinite(near.numpy()))
    assert RotaryEmbedding().max_position is None
