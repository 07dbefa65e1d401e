"""Block-local attention for `RelativeMultiHeadAttention` (`attention_window`).

A mixin: queries in blocks of W attend to their block and its two
neighbours (`ops.blocks`), with the position bias of every band.
"""

from keras_posenc import ops
from keras_posenc._backend import xp
from keras_posenc._compat import dim


class LocalAttention:
    """The block-local path of `RelativeMultiHeadAttention` (a mixin).

    It reads the layer's `attention_window`, `num_heads`, `position_bias` and
    `compute_attention`.
    """

    def _local_context(
        self,
        inputs,
        heads,
        key_mask,
        query_mask,
        causal,
        training,
        start_index=0,
        segments=None,
        attention_bias=None,
    ):
        """Block-local context `(B, N, T, Hv)`: the band, then `compute_attention`.

        `inputs` are the `(query, key)` tensors the position bias reads,
        `heads` the projected `(q, k, v)`, `segments` the `(runs, positions)`
        of packed rows or None; the bias of every band comes from
        `_band_bias`, plus `attention_bias` on the band `(B or 1, N*nb, W, 3W)`.
        """
        q, k, v = heads
        window, length = self.attention_window, dim(q, 2)
        query_pos, key_pos = ops.blocks.block_positions(length, window)
        bias = None
        if self.position_bias is not None:
            bias = self._band_bias(
                inputs, query_pos, key_pos, length, start_index, segments
            )
        if attention_bias is not None:
            extra = xp.cast(attention_bias, xp.float32)
            bias = extra if bias is None else bias + extra
        allowed = ops.blocks.band_allowed(
            query_pos,
            key_pos,
            length,
            self.num_heads,
            key_mask,
            query_mask,
            causal,
            runs=None if segments is None else segments[0],
        )  # (B or 1, N*nb, W, 3W)
        context, _ = self.compute_attention(
            ops.blocks.to_blocks(q, window),
            ops.blocks.to_band(k, window),
            ops.blocks.to_band(v, window),
            bias,
            allowed,
            training,
        )
        return ops.blocks.from_blocks(context, self.num_heads, length)

    def _band_bias(self, inputs, query_pos, key_pos, length, start_index, segments):
        """The bias of every block's band `(1 or B, N*nb, W, 3W)`, float32.

        A translation-invariant producer sees the same distances `-(2W-1) ..
        2W-1` in every band: it is evaluated once, `(1, N, W, 3W)`, and
        repeated over the blocks (slots outside the sequence are masked).
        Otherwise each block is evaluated at its true positions (in packed
        rows, the positions inside each run: one bias per row).
        """
        producer, window = self.position_bias, self.attention_window
        if getattr(producer, "translation_invariant", False):
            stubs = [xp.zeros([1, size, 1]) for size in (window, 3 * window)]
            bias = xp.cast(producer(*stubs, start_index=window), xp.float32)
            heads, blocks = bias.shape[1], xp.shape(query_pos)[0]
            shape = [1, heads, blocks, window, 3 * window]
            bias = xp.broadcast_to(bias[:, :, None], shape)  # (1, N, nb, W, 3W)
            return xp.reshape(bias, [1, -1, window, 3 * window])
        if segments is not None:  # (B, nb, W) and (B, nb, 3W) run positions
            rows = segments[1]
            q_at = ops.blocks.rows_of_blocks(rows, window, 0)
            k_at = ops.blocks.band_of_rows(rows, window, 0)
            flat = [xp.reshape(p, [-1, p.shape[-1]]) for p in (q_at, k_at)]
            bias = producer(*inputs, positions=flat[0], key_positions=flat[1])
            bias = xp.cast(bias, xp.float32)  # (B*nb, N, W, 3W)
            blocks = xp.shape(q_at)[1]
            bias = xp.reshape(bias, [-1, blocks] + list(bias.shape[1:]))
            bias = xp.transpose(bias, [0, 2, 1, 3, 4])  # (B, N, nb, W, 3W)
            return xp.reshape(bias, [xp.shape(bias)[0], -1, window, 3 * window])
        # True positions; slots past the sequence (masked) borrow its ends.
        last, offset = length - 1, xp.cast(start_index, query_pos.dtype)
        q_at, k_at = (
            xp.clip_by_value(p, 0, last) + offset for p in (query_pos, key_pos)
        )
        bias = producer(*inputs, positions=q_at, key_positions=k_at)
        return ops.blocks.fold_bias(xp.cast(bias, xp.float32))  # (1, N*nb, W, 3W)
