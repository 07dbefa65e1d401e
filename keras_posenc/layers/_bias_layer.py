"""The bias contract shared by every relative-position producer (docs/style.md)."""

from keras_posenc import ops
from keras_posenc._backend import xp
from keras_posenc._compat import build_sublayer, clone_initializer, dim, keras, rank
from keras_posenc.layers._positions import resolve_positions


class BiasLayer(keras.layers.Layer):
    """Base of bias producers: `(query, key, ...) -> (1, N, T, S)` or `(B, N, T, S)`.

    `call` resolves the query and key positions once (`positions`,
    `key_positions`, `start_index`; keys start at 0) and hands them to
    `bias_between`, the one method each producer implements: float32
    positions `(T,)` / `(B, T)` (and `(S,)` / `(B, S)`) in, a float32 bias
    `(N, T, S)` / `(B, N, T, S)` out. A producer whose bias depends only on
    `j - i` (`translation_invariant`) is evaluated on the `T + S - 1`
    distinct distances only when the positions are the default ranges, and
    the row is expanded to `(T, S)`. A bias has no tokens, so no mask passes on.
    """

    #: Whether the bias depends on `key_position - query_position` alone.
    translation_invariant = True
    #: Ranks accepted for explicit positions.
    position_ranks = (1, 2)

    def call(self, query, key=None, start_index=0, positions=None, key_positions=None):
        key = query if key is None else key
        if positions is None and key_positions is None and self.translation_invariant:
            bias = self._bias_on_distinct_distances(
                dim(query, 1), dim(key, 1), start_index
            )
        else:
            q_pos = resolve_positions(
                query, start_index, positions, self.position_ranks
            )
            k_pos = resolve_positions(key, 0, key_positions, self.position_ranks)
            bias = self.bias_between(q_pos, k_pos)
        return self._returned(bias)

    def _returned(self, bias):
        """A float32 bias `(N, T, S)` / `(B, N, T, S)` as `call` returns it:
        rank 4, in the compute dtype."""
        if rank(bias) == 3:
            bias = xp.expand_dims(bias, 0)  # (1, N, T, S); its gradient a reshape
        return xp.cast(bias, self.compute_dtype)

    def compute_output_shape(self, query_shape, key_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        return (1, self.num_heads, query_shape[1], key_shape[1])

    def compute_mask(self, query, mask=None):
        return None

    def bias_between(self, query_positions, key_positions):
        """Float32 bias `(..., N, T, S)` between positions `(..., T)`, `(..., S)`."""
        raise TypeError(
            f"{type(self).__name__} must define bias_between(query_positions, "
            "key_positions) to be a bias producer"
        )

    def _bias_on_distinct_distances(self, query_length, key_length, start_index):
        """`(N, T, S)` from the bias of the distances `-(T-1)-start .. S-1-start`."""
        distinct = xp.range(query_length + key_length - 1, dtype=xp.float32)
        distinct = distinct - xp.cast(query_length - 1, xp.float32)
        distinct = distinct - xp.cast(start_index, xp.float32)  # (T + S - 1,)
        row = self.bias_between(xp.zeros([1]), distinct)[:, 0]  # (N, T + S - 1)
        return ops.toeplitz(row, query_length, key_length)  # (N, T, S)


def distance_mlp(input_width, hidden_dim, num_hidden, num_heads, kernel_initializer):
    """Built float32 Dense layers `mlp_0 ..`: `num_hidden` ReLU layers of
    `hidden_dim`, then one output per head (a producer's MLP of distances)."""
    layers, width = [], input_width
    for index in range(num_hidden + 1):
        last = index == num_hidden
        layer = keras.layers.Dense(
            num_heads if last else hidden_dim,
            activation=None if last else "relu",
            kernel_initializer=clone_initializer(kernel_initializer),
            dtype="float32",
            name=f"mlp_{index}",
        )
        build_sublayer(layer, (None, width))
        layers.append(layer)
        width = hidden_dim
    return layers
