"""Hierarchical position network: a position generator per Transformer layer."""

import functools

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import build_sublayer, incoming_mask, keras, register
from keras_posenc._compat import dim as axis_size
from keras_posenc.layers.activation_range import ActivationRange
from keras_posenc.layers.quantized_dense import QuantizedDense
from keras_posenc.layers.segment_positions import check_segment_ids
from keras_posenc.ops import quantization

FEATURES = ("sinusoid", "conv")
#: The layers of one generator, in call order, for each `position_features`.
GENERATOR_PARTS = {
    "sinusoid": ("hidden", "output"),
    "conv": ("conv", "hidden", "output"),
}
#: With `quantize`: the tensors each generator rounds besides its Dense
#: outputs (the content half of the first layer and the folded position
#: half, or the convolution's output); each layer also rounds its sum
#: `x + pos_info`.
GENERATOR_POINTS = {"sinusoid": ("content", "positions"), "conv": ("conv", "read")}


@register
class HierarchicalPositionNetwork(keras.layers.Layer):
    """A position generator per layer: `x_l + G_l(x_l, position)`.

    The HPN of docs/design.md, called as written there: `hpn(inputs,
    layer_idx)` returns `inputs + pos_info` with `pos_info = G_g(inputs,
    position)`, `g` the generator of layer `layer_idx`. A generator that saw
    only content would be permutation-equivariant and carry no position, so
    each one also sees the position, as chosen by `position_features`:

    - `"sinusoid"`: `G(x) = W2 relu(W1 [x, sin/cos(index)] + b1) + b2`, an MLP
      over the content and sinusoid features of the token index (width
      `hidden_dim`); with static shapes the sinusoids are constants.
    - `"conv"`: `G(x) = W2 relu(W1 dwconv(x) + b1) + b2`, where a depthwise
      convolution of width `kernel_size` over the zero-padded sequence derives
      position from the boundaries, as conditional positional encodings (PEG)
      do; it needs no maximum length. With `causal=True` the convolution
      reads the token and the `kernel_size - 1` before it (left zero
      padding), so no position sees a later token (causal language models).

    `num_generators` distinct generators serve the `depth` layers: layer `l`
    uses generator `l * num_generators // depth` (`num_generators=1` shares
    one generator across all layers, `depth` gives one per layer).
    `position_l2` adds `position_l2 * mean(pos_info^2)` to the model losses
    and `dropout` drops generated positions during training.

    With `quantize=True` every tensor a full-int8 TFLite model rounds is
    rounded on a range learned in training (quantization-aware training,
    `tflite_export.quantize_aware`): the Dense kernels and outputs, the
    convolution's kernel and output, and the sum (the inputs are rounded
    where they are made). The sinusoid
    features' first layer is computed as the int8 model computes it, in two
    halves: `x W1[:D]` (rounded) plus `sin/cos(index) W1[D:] + b1`, a
    function of the positions alone that the converter folds into one int8
    table (rounded on its learned range); so no concatenation rescales the
    content to the sinusoids' range.

    Args:
        dim: int, the model width D of inputs and outputs.
        depth: int, the number of layers served.
        num_generators: int, distinct generators (parameter sharing).
            Defaults to `None` (one per layer).
        position_features: str, `"sinusoid"` or `"conv"`.
            Defaults to `"sinusoid"`.
        hidden_dim: int, the generator MLP width. Defaults to `None` (D).
        kernel_size: int, odd width of the `"conv"` features. Defaults to `3`.
        position_l2: float, activity L2 weight on generated positions.
            Defaults to `0.0`.
        dropout: float, dropout rate on generated positions. Defaults to `0.0`.
        max_wavelength: float, of the sinusoid features. Defaults to `10000.0`.
        causal: bool, `"conv"` features read no later token. Defaults to
            `False` (a centred window).
        quantize: bool, round as the int8 model does (see above).
            Defaults to `False`.
        kernel_bits: int, with `quantize`, the generators' kernel grid: 8,
            or 4 (an int4 LM's). Defaults to `8`.

    Call arguments:
        inputs: tensor `(B, T, D)`, the previous layer's output.
        layer_idx: int, the index of the current layer in `[0, depth)`;
            positional (as in docs/design.md) or keyword.
        training: bool, whether dropout is active.
        start_index: int or scalar tensor, the position of the first token
            (decoding with a cache). Defaults to `0`.
        mask: optional boolean `(B, T)` Keras mask: `"conv"` features read
            padded tokens as zeros, so padding never changes real tokens.
        state: optional `(B, S_max, D)` inputs of positions `0 .. S_max - 1`
            (causal `"conv"` decoding, as a key/value cache): these tokens are
            written at `start_index` and the convolution reads the
            `kernel_size - 1` inputs before each of them (zeros before 0).
        segment_ids: optional int `(B, T)`, a packed row
            (`keras_posenc.ops.segments`): the sinusoid features read
            positions that restart at 0 in each document and the `"conv"`
            features read a neighbour of another document as zero, so each
            document gets the positions it gets alone. Not with `state` nor
            `quantize`.
        max_length: optional int, the cache's length S_max when decoding:
            inside an export (`keras_posenc.ops.cache.static_decoding`) the
            sinusoid features of positions `start_index ...` are then rows
            of a constant table of S_max positions (no SIN or COS at run
            time).
        state_range: with `quantize` and `state`, the `ActivationRange` of
            the layer that made `inputs` (e.g. `LayerNorm.output_range`):
            the state keeps the inputs on their own int8 range. (A range of
            its own, learned from the same tensor, would differ by a hair,
            and the converter refuses two near-equal ranges on one tensor.)

    Returns:
        `inputs + pos_info`, a `(B, T, D)` tensor; with `state`, also the
        updated state.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> hpn = keras_posenc.HierarchicalPositionNetwork(dim=8, depth=2)
    >>> x = tf.zeros((2, 5, 8))
    >>> hpn(hpn(x, 0), 1).shape
    TensorShape([2, 5, 8])

    References:
        - [Chu et al., 2021 (CPE/PEG)](https://arxiv.org/abs/2102.10882)
        - [Ke et al., 2020 (TUPE)](https://arxiv.org/abs/2006.15595)
    """

    def __init__(
        self,
        dim,
        depth,
        num_generators=None,
        position_features="sinusoid",
        hidden_dim=None,
        kernel_size=3,
        position_l2=0.0,
        dropout=0.0,
        max_wavelength=10000.0,
        causal=False,
        quantize=False,
        kernel_bits=8,
        **kwargs,
    ):
        dim = _checks.positive_int("dim", dim)
        depth = _checks.positive_int("depth", depth)
        num_generators = _checks.positive_int(
            "num_generators", num_generators, allow_none=True
        )
        if num_generators is not None and num_generators > depth:
            _checks.fail("num_generators", f"<= depth ({depth})", num_generators)
        _checks.choice("position_features", position_features, FEATURES)
        hidden_dim = _checks.positive_int("hidden_dim", hidden_dim, allow_none=True)
        kernel_size = _checks.positive_int("kernel_size", kernel_size)
        if kernel_size % 2 == 0:
            _checks.fail("kernel_size", "an odd integer >= 1", kernel_size)
        if position_l2 != 0.0:
            position_l2 = _checks.positive_float("position_l2", position_l2)
        dropout = _checks.rate("dropout", dropout)
        max_wavelength = _checks.positive_float("max_wavelength", max_wavelength)
        causal = _checks.boolean("causal", causal)
        quantize = _checks.rounds_on_tensorflow(
            "quantize", _checks.boolean("quantize", quantize)
        )
        kernel_bits = quantization.check_kernel_bits(kernel_bits)
        super().__init__(**kwargs)
        self.causal = causal
        self.quantize = quantize
        self.kernel_bits = kernel_bits
        self.dim = dim
        self.depth = depth
        self.num_generators = num_generators
        self.position_features = position_features
        self.hidden_dim = hidden_dim
        self.kernel_size = kernel_size
        self.position_l2 = float(position_l2)
        self.dropout = dropout
        self.max_wavelength = max_wavelength
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def __call__(self, inputs, layer_idx=None, *args, **kwargs):
        # Keras 3 accepts only tensors positionally: pass layer_idx by name.
        if layer_idx is not None:
            kwargs["layer_idx"] = layer_idx
        return super().__call__(inputs, *args, **kwargs)

    def build(self, input_shape):
        if input_shape[-1] != self.dim:
            raise ValueError(
                f"The input width must equal `dim`. Received: dim={self.dim}, "
                f"input_shape={input_shape}"
            )
        hidden = self.hidden_dim or self.dim
        features = 2 * self.dim if self.position_features == "sinusoid" else self.dim
        batch_time = tuple(input_shape[:-1])
        # One flat list: Keras 2's .keras saver skips lists nested in lists.
        self.generator_layers = []
        for g in range(self.num_generators or self.depth):
            layers = []
            if self.position_features == "conv":
                conv = keras.layers.DepthwiseConv1D(
                    self.kernel_size,
                    padding="valid" if self.causal else "same",
                    dtype=self.dtype_policy,
                    name=f"conv_{g}",
                )
                build_sublayer(conv, (input_shape[0], None, input_shape[-1]))
                layers.append(conv)
            dense = keras.layers.Dense
            if self.quantize:
                dense = functools.partial(QuantizedDense, kernel_bits=self.kernel_bits)
            hidden_layer = dense(
                hidden, "relu", dtype=self.dtype_policy, name=f"hidden_{g}"
            )
            build_sublayer(hidden_layer, batch_time + (features,))
            output = dense(self.dim, dtype=self.dtype_policy, name=f"output_{g}")
            build_sublayer(output, batch_time + (hidden,))
            self.generator_layers.extend(layers + [hidden_layer, output])
        # With quantize: flat lists of rounding points (generator g's, then
        # layer l's, in the order of GENERATOR_POINTS and LAYER_POINTS).
        self.generator_ranges, self.layer_ranges = [], []
        if self.quantize:
            for g in range(self.num_generators or self.depth):
                for point in GENERATOR_POINTS[self.position_features]:
                    self.generator_ranges.append(self._range(f"{point}_range_{g}"))
            for index in range(self.depth):
                self.layer_ranges.append(self._range(f"sum_range_{index}"))
        self.built = True

    def call(
        self,
        inputs,
        layer_idx=0,
        training=None,
        start_index=0,
        state=None,
        mask=None,
        segment_ids=None,
        max_length=None,
        state_range=None,
    ):
        generator = self.generator(self.generator_index(layer_idx))
        rounding = self._rounding(layer_idx, training)
        mask = incoming_mask(inputs, mask)  # Keras 3 passes none beside segment_ids
        segment_ids = self._check_call(segment_ids, state)
        inputs_read = self._masked_read(inputs, mask, rounding)
        conv = self.position_features == "conv"
        features = inputs_read
        if segment_ids is not None and conv:
            features = self._segment_conv(
                generator["conv"], inputs_read, ops.segments.runs(segment_ids)
            )
        elif self.causal and conv:
            if state is None:  # zeros before the first token
                padding = [[0, 0], [self.kernel_size - 1, 0], [0, 0]]
                features = xp.pad(inputs_read, padding)
            else:
                cached = self._state_rounding(state_range)
                features, state = ops.cache.causal_window(
                    state, inputs_read, start_index, self.kernel_size, cached
                )
        parts = GENERATOR_PARTS[self.position_features]
        if self.position_features == "sinusoid":
            where = (start_index, max_length)
            features, parts = self._sinusoid_features(
                inputs, generator, segment_ids, where, (rounding, training)
            )
        features = self._generate(
            generator, features, (parts, segment_ids), (rounding, training)
        )
        pos_info = self._dropout_layer(features, training=training)  # (B, T, D)
        if self.position_l2:
            squared = xp.square(xp.cast(pos_info, xp.float32))
            self.add_loss(self.position_l2 * xp.reduce_mean(squared))
        outputs = rounding("sum", inputs + pos_info)
        if state is not None:
            return outputs, state
        return outputs

    def _check_call(self, segment_ids, state):
        """`segment_ids` as a checked tensor (or None); refused call pairs."""
        if state is not None and not (self.causal and self.position_features == "conv"):
            raise ValueError(
                "`state` is for causal 'conv' features only. Received: state "
                f"with position_features={self.position_features!r}, "
                f"causal={self.causal}"
            )
        if segment_ids is None:
            return None
        if self.quantize:
            _checks.fail(
                "segment_ids",
                "None for a layer with quantize=True (a packed row's "
                "per-document convolution and positions are not rounded)",
                "a segment_ids tensor",
            )
        segment_ids = xp.convert_to_tensor(segment_ids)
        check_segment_ids(segment_ids)
        if state is not None:
            _checks.fail(
                "state",
                "None with `segment_ids` (decoding runs one document per row)",
                "a state tensor",
            )
        return segment_ids

    def _masked_read(self, inputs, mask, rounding):
        """The inputs the convolution reads: padded neighbours as zeros, as
        past the end of a shorter input."""
        if mask is None or self.position_features != "conv":
            return inputs
        real = xp.cast(mask, bool)[:, :, None]
        if not self.quantize:
            return xp.where(real, inputs, xp.zeros_like(inputs))
        # int8: times 0/1 weights on their exact grid (a SELECT of the input
        # and a zero would need one scale twice, which the converter
        # recomputes and refuses)
        weights = quantization.fake_quant(xp.where(real, 1.0, 0.0), 0.0, 1.0)
        return rounding("read", inputs * xp.cast(weights, inputs.dtype))

    def _sinusoid_features(self, inputs, generator, segment_ids, where, rounded):
        """`(features, parts left)` of the sinusoid generator: `[x, sin/cos]`
        `(B, T, 2D)`, or quantized the first layer already applied in two
        halves (`round(x W1[:D]) + round(sin/cos W1[D:] + b1)`)."""
        rounding, training = rounded
        start_index, max_length = where
        encode = self._sinusoids(segment_ids)
        if self.quantize:
            hidden = generator["hidden"]
            features = self._split_hidden(hidden, inputs, encode, where, rounding)
            return hidden.output_range(features, training=training), ("output",)
        length = axis_size(inputs, 1)
        table = self._rows(encode, start_index, length, max_length)
        table = xp.broadcast_to(xp.cast(table, inputs.dtype), xp.shape(inputs))
        features = xp.concat([inputs, table], axis=-1)  # (B, T, 2D)
        return features, GENERATOR_PARTS[self.position_features]

    def _generate(self, generator, features, which, rounded):
        """`features` through the generator's parts `which[0]`, in order (a
        packed row's convolution, `which[1]` given, is done already)."""
        (parts, segment_ids), (rounding, training) = which, rounded
        for part in parts:
            if part == "conv" and segment_ids is not None:
                continue  # done tap by tap above
            if part == "conv" and self.quantize:
                features = self._rounded_conv(generator[part], features)
                features = rounding("conv", features)
            elif self.quantize:  # QuantizedDense: its output range learns
                features = generator[part](features, training=training)
            else:
                features = generator[part](features)
        return features

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "dim": self.dim,
                "depth": self.depth,
                "num_generators": self.num_generators,
                "position_features": self.position_features,
                "hidden_dim": self.hidden_dim,
                "kernel_size": self.kernel_size,
                "position_l2": self.position_l2,
                "dropout": self.dropout,
                "max_wavelength": self.max_wavelength,
                "causal": self.causal,
                "quantize": self.quantize,
                "kernel_bits": self.kernel_bits,
            }
        )
        return config

    def _range(self, name):
        point = ActivationRange(name=name, dtype=self.dtype_policy)
        build_sublayer(point, (None,))
        return point

    def _rounding(self, layer_idx, training):
        """`round(point, x)` on the ranges of layer `layer_idx` and its generator."""
        if not self.quantize:
            return lambda point, x: x
        generator_points = GENERATOR_POINTS[self.position_features]
        g = self.generator_index(layer_idx)
        points = {
            point: self.generator_ranges[g * len(generator_points) + i]
            for i, point in enumerate(generator_points)
        }
        points["sum"] = self.layer_ranges[layer_idx]
        return lambda point, x: points[point](x, training=training)

    def _state_rounding(self, state_range):
        """`round(x)` of the cached inputs on their maker's range (quantize)."""
        if not self.quantize:
            return None
        if not isinstance(state_range, ActivationRange):
            _checks.fail(
                "state_range",
                "the ActivationRange of the layer that made `inputs` (a "
                "quantized layer's cached inputs keep its int8 range)",
                state_range,
                error=TypeError,
            )
        return lambda x: state_range(x, training=False)

    def _sinusoids(self, segment_ids):
        """`encode(start, count)`: sinusoid features `(T, D)` (packed: `(B, T, D)`)."""
        if segment_ids is not None:  # (B, T): from 0 in every document
            positions = xp.cast(ops.segments.positions(segment_ids), xp.float32)
            table = ops.sinusoid(positions, self.dim, self.max_wavelength)
            return lambda start, count: table
        return lambda start, count: ops.sinusoid(
            ops.position_range(count, start), self.dim, self.max_wavelength
        )

    @staticmethod
    def _rows(encode, start_index, length, max_length):
        """`encode` at `start_index ...`: a constant's rows inside an export."""
        if max_length is None:
            return encode(start_index, length)
        return ops.cache.position_rows(encode, start_index, length, max_length)

    def _split_hidden(self, hidden, inputs, encode, where, rounding):
        """The first layer's pre-activation, then ReLU, as int8 computes it.

        `round(x W1[:D]) + round(sin/cos W1[D:] + b1)`: the second half reads
        the positions alone, so the converter folds it into one int8 constant
        (its rows at `where = (start_index, max_length)` when decoding).
        """
        kernel = hidden.kernel  # (2D, hidden)
        bits = getattr(hidden, "kernel_bits", quantization.NUM_BITS)  # 4: int4 LMs
        content_kernel = quantization.fake_quant_weight(kernel[: self.dim], bits)
        content = xp.tensordot(
            inputs, xp.cast(content_kernel, inputs.dtype), [[2], [0]]
        )  # (B, T, hidden)
        content = rounding("content", content)

        def position_half(start, count):  # (T, hidden) float32
            weight = xp.cast(kernel[self.dim :], xp.float32)
            return xp.matmul(encode(start, count), weight) + xp.cast(
                hidden.bias, xp.float32
            )

        start_index, max_length = where
        half = self._rows(position_half, start_index, axis_size(inputs, 1), max_length)
        half = xp.cast(rounding("positions", half), inputs.dtype)
        return xp.nn.relu(content + half)

    def _rounded_conv(self, conv, features):
        """`conv(features)` with its kernel on the int8 grid (per tensor)."""
        kernel, *bias = conv.weights  # (k, D, 1), (D,)
        kernel = xp.cast(quantization.fake_quant_weight(kernel), features.dtype)
        padding = "VALID" if self.causal else "SAME"  # causal: padded already
        output = xp.nn.depthwise_conv2d(
            features[:, None], kernel[None], [1, 1, 1, 1], padding
        )  # (B, 1, T, D)
        if bias:  # added before the slice: the converter fuses it into the conv
            output = output + xp.cast(bias[0], output.dtype)
        return output[:, 0]  # (B, T, D)

    def _segment_conv(self, conv, inputs, runs):
        """`conv` of `inputs` `(B, T, D)` tap by tap, blind to other runs."""
        kernel, *bias = conv.weights  # (k, D, 1), (D,)
        first = -(self.kernel_size - 1) if self.causal else -(self.kernel_size // 2)
        output = None
        for tap in range(self.kernel_size):
            weight = xp.cast(kernel[tap, :, 0], inputs.dtype)  # (D,)
            term = ops.segments.shift_within(inputs, runs, first + tap) * weight
            output = term if output is None else output + term
        if bias:
            output = output + xp.cast(bias[0], inputs.dtype)
        return output

    def generator(self, index):
        """`{part: layer}` of generator `index` (parts in `GENERATOR_PARTS`)."""
        parts = GENERATOR_PARTS[self.position_features]
        start = index * len(parts)  # generators lie one after another
        return dict(zip(parts, self.generator_layers[start : start + len(parts)]))

    def generator_index(self, layer_idx):
        """The generator that serves layer `layer_idx`."""
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int):
            _checks.fail("layer_idx", "a Python int", layer_idx, error=TypeError)
        if not 0 <= layer_idx < self.depth:
            _checks.fail("layer_idx", f"in [0, depth={self.depth})", layer_idx)
        return layer_idx * (self.num_generators or self.depth) // self.depth
