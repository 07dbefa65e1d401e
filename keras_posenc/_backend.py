"""The tensor functions the layers are written with, on every Keras backend.

The layers and ops call `xp.<name>` with TensorFlow's names and signatures
(`xp.reduce_sum(x, axis)`, `xp.gather(x, i, batch_dims=1)`, ...). On
TensorFlow (Keras 3's TensorFlow backend, or Keras 2) `xp` *is* the `tf`
module, so the graphs, the TFLite files and their int8 kernels are exactly
those of the TensorFlow code; on JAX and PyTorch (`KERAS_BACKEND=jax` or
`torch`) `xp` is `KerasOps`, the same names written with `keras.ops`.

A function only TensorFlow has (a `tf.function` signature, an XLA-only
write, a registered gradient) is asked for by `IS_TENSORFLOW` where it is
used, and the JAX and PyTorch side says what it does instead.
"""

import types

import numpy as np
import tensorflow as tf

from keras_posenc._compat import IS_KERAS_3

if IS_KERAS_3:
    import keras  # Keras 3 itself: `tf.keras` is its tf_keras-shaped view

#: Every Keras 3 backend the layers, builders and causal LMs run on.
BACKENDS = ("tensorflow", "jax", "torch")
#: The backend the layers run on: "tensorflow", "jax" or "torch".
BACKEND = keras.backend.backend() if IS_KERAS_3 else "tensorflow"
#: True where `xp` is TensorFlow itself (Keras 2, or Keras 3 on TensorFlow).
IS_TENSORFLOW = BACKEND == "tensorflow"
#: The widest float the backend keeps: JAX, without `jax_enable_x64`, has
#: no float64 (the compiled loop's sampler then reads float32 logits).
FLOAT64 = "float64"
if BACKEND == "jax":
    import jax

    FLOAT64 = "float64" if jax.config.jax_enable_x64 else "float32"


def _is_static(value):
    """True for a Python int or a list/tuple of them (a static shape)."""
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, (list, tuple)) and all(map(_is_static, value))


def _static(value):
    """`value` as Python ints where it is a static shape, else unchanged."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (list, tuple)) and _is_static(value):
        return [_static(v) for v in value]
    return value


def _dtype(dtype):
    return None if dtype is None else keras.backend.standardize_dtype(dtype)


class KerasOps:
    """TensorFlow's tensor functions, as the layers call them, in `keras.ops`.

    Shapes are static on JAX and PyTorch (Keras traces with concrete sizes),
    so `shape(x)` is a tuple of ints and a shape built from it stays Python.
    """

    float16, bfloat16, float32, float64 = "float16", "bfloat16", "float32", "float64"
    int8, int32, int64, bool = "int8", "int32", "int64", "bool"

    def __init__(self):
        ops = keras.ops
        self.ops = ops
        self.abs, self.exp, self.sin, self.cos = ops.abs, ops.exp, ops.sin, ops.cos
        self.floor, self.round, self.sign = ops.floor, ops.round, ops.sign
        self.square, self.sigmoid, self.pow = ops.square, ops.sigmoid, ops.power
        self.tanh = ops.tanh
        self.maximum, self.minimum = ops.maximum, ops.minimum
        self.equal, self.not_equal = ops.equal, ops.not_equal
        self.logical_and = ops.logical_and
        self.einsum, self.tensordot = ops.einsum, ops.tensordot
        self.transpose, self.stack = ops.transpose, ops.stack
        self.zeros_like, self.ones_like = ops.zeros_like, ops.ones_like
        self.expand_dims = ops.expand_dims
        self.is_tensor = ops.is_tensor
        self.nn = types.SimpleNamespace(
            relu=ops.relu,
            softmax=ops.softmax,
            log_softmax=ops.log_softmax,
            leaky_relu=lambda x, alpha=0.2: ops.leaky_relu(x, alpha),
            depthwise_conv2d=self._depthwise_conv2d,
        )
        self.math = types.SimpleNamespace(
            log=ops.log,
            log1p=ops.log1p,
            ceil=ops.ceil,
            rsqrt=ops.rsqrt,
            log_sigmoid=ops.log_sigmoid,
            erf=ops.erf,
            l2_normalize=lambda x, axis=-1: ops.normalize(x, axis=axis, order=2),
            unsorted_segment_sum=lambda x, ids, n: self._segments(
                ops.segment_sum, x, ids, n
            ),
            unsorted_segment_min=lambda x, ids, n: (
                -self._segments(ops.segment_max, -x, ids, n)
            ),
        )
        self.linalg = types.SimpleNamespace(band_part=self._band_part)
        self.random = types.SimpleNamespace(normal=self._normal)
        self.nest = types.SimpleNamespace(flatten=keras.tree.flatten)

    # Conversions and shapes.
    def cast(self, x, dtype):
        return self.ops.cast(x, _dtype(dtype))

    def constant(self, value, dtype=None):
        return self.ops.convert_to_tensor(np.asarray(value), _dtype(dtype))

    def convert_to_tensor(self, value, dtype=None):
        return self.ops.convert_to_tensor(value, _dtype(dtype))

    def as_dtype(self, dtype):
        return np.dtype(_dtype(dtype))

    def get_static_value(self, x):
        if self.is_tensor(x):
            try:
                return keras.ops.convert_to_numpy(x)
            except Exception:  # a traced value: not static
                return None
        return x

    def shape(self, x):
        return tuple(self.ops.shape(x))

    def ensure_shape(self, x, shape):
        return x

    def identity(self, x):
        return x

    def reshape(self, x, shape):
        return self.ops.reshape(x, _static(shape))

    def broadcast_to(self, x, shape):
        return self.ops.broadcast_to(x, _static(shape))

    def concat(self, values, axis):
        if all(_is_static(v) for v in values):  # a shape
            return [int(n) for v in values for n in v]
        return self.ops.concatenate(values, axis=axis)

    def zeros(self, shape, dtype="float32"):
        return self.ops.zeros(_static(shape), _dtype(dtype))

    def ones(self, shape, dtype="float32"):
        return self.ops.ones(_static(shape), _dtype(dtype))

    def fill(self, shape, value):
        if isinstance(value, bool):
            dtype = "bool"
        elif isinstance(value, int):
            dtype = "int32"
        else:
            dtype = _dtype(getattr(value, "dtype", "float32"))
        return self.ops.full(_static(shape), value, dtype)

    def eye(self, n, dtype="float32"):
        return self.ops.eye(n, dtype=_dtype(dtype))

    def range(self, start, limit=None, delta=1, dtype=None):
        start, limit = (0, start) if limit is None else (start, limit)
        if dtype is None:
            floats = any(isinstance(v, float) for v in (start, limit, delta))
            dtype = "float32" if floats else "int32"
        return self.ops.arange(start, limit, delta, dtype=_dtype(dtype))

    # Reductions.
    def reduce_sum(self, x, axis=None, keepdims=False):
        return self.ops.sum(x, axis=axis, keepdims=keepdims)

    def reduce_mean(self, x, axis=None, keepdims=False):
        return self.ops.mean(x, axis=axis, keepdims=keepdims)

    def reduce_max(self, x, axis=None, keepdims=False):
        return self.ops.max(x, axis=axis, keepdims=keepdims)

    def reduce_min(self, x, axis=None, keepdims=False):
        return self.ops.min(x, axis=axis, keepdims=keepdims)

    def reduce_prod(self, x, axis=None, keepdims=False):
        return self.ops.prod(x, axis=axis, keepdims=keepdims)

    def reduce_any(self, x, axis=None, keepdims=False):
        return self.ops.any(x, axis=axis, keepdims=keepdims)

    def reduce_all(self, x, axis=None, keepdims=False):
        return self.ops.all(x, axis=axis, keepdims=keepdims)

    def reduce_logsumexp(self, x, axis=None, keepdims=False):
        return self.ops.logsumexp(x, axis=axis, keepdims=keepdims)

    def cumsum(self, x, axis=0, exclusive=False, reverse=False):
        if reverse:
            x = self.ops.flip(x, axis=axis)
        summed = self.ops.cumsum(x, axis=axis)
        if exclusive:
            summed = summed - x
        return self.ops.flip(summed, axis=axis) if reverse else summed

    def matmul(self, a, b, transpose_a=False, transpose_b=False):
        if transpose_a:
            a = self.ops.swapaxes(a, -1, -2)
        if transpose_b:
            b = self.ops.swapaxes(b, -1, -2)
        return self.ops.matmul(a, b)

    def argmax(self, x, axis=None, output_type="int64"):
        return self.ops.cast(self.ops.argmax(x, axis=axis), _dtype(output_type))

    def cond(self, pred, true_fn, false_fn):
        return self.ops.cond(pred, true_fn, false_fn)

    def while_loop(self, cond, body, loop_vars, maximum_iterations=None, **unused):
        return self.ops.while_loop(cond, body, loop_vars, maximum_iterations)

    # Elementwise.
    def where(self, condition, x, y):
        return self.ops.where(condition, x, y)

    def clip_by_value(self, x, low, high):
        return self.ops.clip(x, low, high)

    def truncatediv(self, x, y):
        quotient = self.ops.floor_divide(self.ops.abs(x), self.ops.abs(y))
        return quotient * self.ops.sign(x) * self.ops.sign(y)

    def add_n(self, values):
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total

    # Indexing and layout.
    def gather(self, params, indices, axis=None, batch_dims=0):
        rank = len(self.ops.shape(params))
        axis = batch_dims if axis is None else axis % rank
        if batch_dims == 0:
            return self.ops.take(params, indices, axis=axis)
        # Only the layout the package uses: gathering on the first non-batch
        # axis. Batch rows become offsets into one flat table.
        shape = self.ops.shape(params)
        if axis != batch_dims:
            raise NotImplementedError("gather: axis must equal batch_dims")
        outer = int(np.prod(shape[:batch_dims]))
        table = self.ops.reshape(params, (outer * shape[axis], *shape[axis + 1 :]))
        wanted = self.ops.shape(indices)
        flat = self.ops.reshape(self.ops.cast(indices, "int32"), (outer, -1))
        offsets = self.ops.arange(outer, dtype="int32")[:, None] * shape[axis]
        taken = self.ops.take(table, self.ops.reshape(flat + offsets, (-1,)), axis=0)
        return self.ops.reshape(taken, (*wanted, *shape[axis + 1 :]))

    def pad(self, x, paddings, constant_values=0):
        return self.ops.pad(x, _static(paddings), constant_values=constant_values)

    def slice(self, x, begin, size):
        """A slice from `begin` (ints or scalar tensors) of static `size`:
        rows taken at tensor offsets, so a traced offset (an export's
        `torch.export`) leaves every shape static."""
        for axis, (start, count) in enumerate(zip(begin, size)):
            if self.is_tensor(start):
                rows = self.ops.arange(count) + self.ops.cast(start, "int32")
                x = self.ops.take(x, rows, axis=axis)
            elif start or count != -1:
                end = None if count == -1 else start + count
                x = x[(slice(None),) * axis + (slice(start, end),)]
        return x

    def tile(self, x, multiples):
        return self.ops.tile(x, _static(multiples))

    def repeat(self, x, repeats, axis=None):
        return self.ops.repeat(x, repeats, axis=axis)

    def reverse(self, x, axis):
        return self.ops.flip(x, axis=tuple(axis))

    def roll(self, x, shift, axis):
        return self.ops.roll(x, shift, axis=axis)

    def argsort(self, x, axis=-1, direction="ASCENDING", stable=False):
        order = self.ops.argsort(x if direction == "ASCENDING" else -x, axis=axis)
        return self.ops.cast(order, "int32")

    def searchsorted(self, sorted_sequence, values, side="left"):
        rows = [
            self.ops.searchsorted(sorted_sequence[r], values[r], side=side)
            for r in range(self.ops.shape(values)[0])
        ]
        return self.ops.cast(self.ops.stack(rows), "int32")

    def meshgrid(self, *arrays, indexing="xy"):
        return self.ops.meshgrid(*arrays, indexing=indexing)

    def _segments(self, reduce, data, ids, count):
        """TensorFlow's segment reductions take ids of any rank; Keras' 1-D."""
        ids_rank = len(self.ops.shape(ids))
        data = self.ops.reshape(data, (-1, *self.ops.shape(data)[ids_rank:]))
        return reduce(data, self.ops.reshape(ids, (-1,)), int(count))

    def _band_part(self, x, lower, upper):
        rows, cols = self.ops.shape(x)[-2:]
        i = self.ops.arange(rows)[:, None]
        j = self.ops.arange(cols)[None, :]
        keep = self.ops.ones((rows, cols), "bool")
        if lower >= 0:
            keep = self.ops.logical_and(keep, i - j <= lower)
        if upper >= 0:
            keep = self.ops.logical_and(keep, j - i <= upper)
        return self.ops.where(keep, x, self.ops.zeros_like(x))

    def _depthwise_conv2d(self, x, kernel, strides, padding):
        return self.ops.depthwise_conv(x, kernel, strides[1:3], padding.lower())

    def _normal(self, shape, mean=0.0, stddev=1.0, dtype="float32", seed=None):
        return keras.random.normal(_static(shape), mean, stddev, _dtype(dtype), seed)


#: The tensor functions of the running backend (see the module docstring).
xp = tf if IS_TENSORFLOW else KerasOps()


def compiled(function, signature, jit_compile, variables):
    """`function` compiled as its backend compiles a decoding loop.

    TensorFlow: a `tf.function` of `signature` (XLA with `jit_compile`).
    JAX: `jax.jit` (always XLA), the `variables`' current values passed in
    at each call, so a trained model never decodes with stale weights.
    PyTorch: `function` itself, eager (Keras' `jit_compile` there covers its
    own train and predict steps; `torch.compile` of this loop was not tried),
    under `torch.no_grad()`: decoding records no autograd graph (keras-hub's
    `generate` does the same), and the loop's caches can be written in place.
    """
    if IS_TENSORFLOW:
        return tf.function(
            function,
            input_signature=signature,
            jit_compile=jit_compile,
            autograph=False,
        )
    if BACKEND != "jax":
        import torch

        def eager(*args):
            with torch.no_grad():
                return function(*args)

        return eager
    import jax

    variables = list(variables)

    def stateless(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return function(*args)

    jitted = jax.jit(stateless)
    return lambda *args: jitted([v.value for v in variables], *args)


def to_numpy(x):
    """A NumPy copy of any backend's tensor (a PyTorch one detached)."""
    if IS_TENSORFLOW:
        return x.numpy()
    return keras.ops.convert_to_numpy(x)
