"""Quantization-aware training in either Keras: the package's own fake quantization.

`quantize_model(model)` returns a copy of a functional model, with its
weights, in which every tensor a full-int8 TFLite model rounds passes a fake
quantizer (`keras_posenc.ops.quantization`): `Dense` becomes `QuantizedDense`,
`Add` becomes `QuantizedAdd`, and the package's layers that take
`quantize=True` round inside (the attention's logits, bias, softmax and
context; the layer norm's every step; the embedding table; the pooled mean).
It trains with `model.fit` in Keras 3 and Keras 2, and
`tflite_export.convert(qat_model, None, mode="int8")` converts it without a
representative dataset. `tflite_export.quantize_aware` is the public door.
"""

import tensorflow as tf

from keras_posenc._compat import keras
from keras_posenc.layers._rope_checks import rotary_rounding_problems
from keras_posenc.layers.activation_range import ActivationRange
from keras_posenc.layers.combined_position_input import CombinedPositionInput
from keras_posenc.layers.gated_position_fusion import GatedPositionFusion
from keras_posenc.layers.hierarchical_position_network import (
    HierarchicalPositionNetwork,
)
from keras_posenc.layers.layer_norm import LayerNorm
from keras_posenc.layers.learned_position_embedding import LearnedPositionEmbedding
from keras_posenc.layers.mean_pooling import MeanPooling
from keras_posenc.layers.quantized_add import QuantizedAdd
from keras_posenc.layers.quantized_dense import QuantizedDense
from keras_posenc.layers.recursive_position_update import RecursivePositionUpdate
from keras_posenc.layers.relative_multi_head_attention import (
    RelativeMultiHeadAttention,
)
from keras_posenc.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)
from keras_posenc.layers.token_embedding import TokenEmbedding
from keras_posenc.models.causal_lm import CausalLM
from keras_posenc.models.methods import QUANTIZED_METHODS  # noqa: F401 (public)
from keras_posenc.ops.quantization import KERNEL_BITS
from keras_posenc.utils import nested_layers, require_tensorflow

#: Package layers rebuilt with `quantize=True`.
ROUNDING_LAYERS = (
    CombinedPositionInput,
    GatedPositionFusion,
    HierarchicalPositionNetwork,
    LayerNorm,
    LearnedPositionEmbedding,
    MeanPooling,
    RecursivePositionUpdate,
    RelativeMultiHeadAttention,
    SinusoidalPositionEncoding,
    TokenEmbedding,
)
#: Keras layers replaced by their rounding form.
REPLACED = {keras.layers.Dense: QuantizedDense, keras.layers.Add: QuantizedAdd}
#: Layers that round nothing of their own (dropout is off at inference).
PASS_THROUGH = (keras.layers.InputLayer, keras.layers.Dropout)


def quantize_model(model, kernel_bits=8):
    """A quantization-aware copy of `model`, with its weights.

    Args:
        model: a float `CausalLM` or functional `keras.Model` of the layers
            whose rounding is modelled (`ROUNDING_LAYERS`, `REPLACED`,
            `PASS_THROUGH`), as the builders make them for `QUANTIZED_METHODS`.
        kernel_bits: 8, or 4 for a `CausalLM` (`quantize="int4"`).

    Returns:
        A `keras.Model` with the same inputs, outputs and float weights, whose
        rounding ranges start from its first training batch (or from a call
        `qat_model(x, training=True)`, which changes no weight): until then
        `tflite_export` refuses to convert it.
    """
    require_tensorflow("quantize_model")
    if kernel_bits not in KERNEL_BITS or isinstance(kernel_bits, bool):
        raise ValueError(
            f"`kernel_bits` must be 8 or 4. Received: kernel_bits={kernel_bits!r}"
        )
    if kernel_bits == 4 and not isinstance(model, CausalLM):
        raise ValueError(
            "`kernel_bits` must be 8 for this model: 4-bit kernels are trained "
            "for a CausalLM (its config keeps them; the attention layers of "
            "another model would rebuild their kernels at 8 bits when it is "
            f"loaded). Received: kernel_bits=4, model={type(model).__name__}"
        )
    if isinstance(model, CausalLM):
        check_float32(model)
        return _quantized_causal_lm(model, kernel_bits)
    if not isinstance(model, keras.Model) or not getattr(model, "inputs", None):
        raise TypeError(
            f"`model` must be a functional keras.Model. Received: {model!r}"
        )
    rounding = [
        layer.name
        for layer in nested_layers(model)
        if isinstance(layer, (ActivationRange, QuantizedDense, QuantizedAdd))
        or _rounds(layer)
    ]
    if rounding:
        raise ValueError(
            "`model` must be a float model: a second quantization-aware copy "
            "would start its ranges afresh and drop the trained ones. Received: "
            f"{model.name}, already quantization-aware (rounding layers "
            f"{', '.join(rounding[:4])}{', ...' if len(rounding) > 4 else ''}). "
            "Train it on, or convert it: tflite_export.convert(model, None)"
        )
    check_float32(model)
    problems = unsupported_layers(model)
    if problems:
        raise ValueError(
            "`model` must be built from layers whose int8 rounding is modelled "
            "(TokenEmbedding, SinusoidalPositionEncoding, LearnedPositionEmbedding, "
            "GatedPositionFusion, CombinedPositionInput, "
            "HierarchicalPositionNetwork, RecursivePositionUpdate, "
            "RelativeMultiHeadAttention dense or block-local (not LSH), with RoPE "
            "of 1-D positions or no rotary, "
            "LayerNorm, MeanPooling, Dense, Add, Dropout). "
            f"Received: {'; '.join(problems)}"
        )
    readers = float_input_readers(model)
    copy = keras.models.clone_model(
        model, clone_function=lambda layer: _rounding_copy(layer, readers)
    )
    for old, new in zip(model.layers, copy.layers):
        _copy_weights(old, new)
    return copy


def check_float32(model, purpose=None):
    """A `ValueError` naming the first layer of `model` that computes in
    another dtype than float32 (a mixed precision policy).

    `purpose` says what needs float32; by default int8 (quantization-aware
    training and int8 TFLite round float32 tensors, and the converter
    cannot quantize float16 ones).
    """
    purpose = purpose or (
        "int8 (quantization-aware training and int8 TFLite round float32 tensors)"
    )
    for layer in nested_layers(model):
        dtype = getattr(layer, "compute_dtype", None) or "float32"
        skip = isinstance(layer, (keras.Model, keras.layers.InputLayer))
        if dtype != "float32" and not skip:
            policy = getattr(layer, "dtype_policy", None)
            policy = getattr(policy, "name", policy)
            raise ValueError(
                f"`model` must compute in float32 for {purpose}. Received: "
                f"layer {layer.name!r} of {model.name} with dtype policy "
                f"{policy!r} (compute dtype {dtype}). Build the model again "
                "under keras.mixed_precision.set_global_policy('float32') and "
                "copy the weights: float_model.set_weights(model.get_weights())"
            )


def unsupported_layers(model):
    """Why each layer or operation of `model` cannot be quantized, as text."""
    problems = []
    readers = float_input_readers(model)
    for operation in getattr(model, "operations", None) or model.layers:
        if operation.name in readers and type(operation) is not keras.layers.Dense:
            problems.append(
                f"{operation.name}: reads a float model input (only a Dense can "
                "round the features it reads)"
            )
        elif _computes_a_mask(operation):
            continue  # Keras' own mask logic (not_equal, logical_or): no rounding
        elif not isinstance(operation, keras.layers.Layer):
            problems.append(
                f"{operation.name}: a tensor operation (use a layer, e.g. "
                "keras.layers.Add for `+`)"
            )
        elif isinstance(operation, RelativeMultiHeadAttention) and (
            _attention_problems(operation)
        ):
            problems.append(
                f"{operation.name}: " + "; ".join(_attention_problems(operation))
            )
        elif isinstance(operation, GatedPositionFusion) and _reads_a_mask(operation):
            problems.append(
                f"{operation.name}: a Keras mask reaches it (mask_zero=True): "
                "its mean over each row's real keys is computed at run time, "
                "and that rounding is not modelled. Build the model with "
                "mask_zero=False (rows of one length), or use another method "
                "(position='t5', 'alibi', ...)"
            )
        elif not isinstance(
            operation, ROUNDING_LAYERS + PASS_THROUGH + tuple(REPLACED)
        ):
            problems.append(f"{operation.name}: {type(operation).__name__}")
    return problems


def _attention_problems(attention):
    """Why `attention`'s int8 rounding is not modelled ([] if it is)."""
    problems = []
    if attention.attention_type == "lsh":
        problems.append("attention_type='lsh' (it sorts: no int8 model)")
    if attention.rotary is not None:
        problems += rotary_rounding_problems(attention.rotary, attention.key_dim)
    return problems


def _rounds(layer):
    """Whether `layer` was built with `quantize=True` (or `"cache"`); Keras 3
    layers also have a `quantize` method, which is not that."""
    flag = getattr(layer, "quantize", False)
    return isinstance(flag, (bool, str)) and bool(flag)


def _reads_a_mask(layer):
    """Whether a Keras mask comes with an input of `layer` in its model."""
    return any(
        getattr(tensor, "_keras_mask", None) is not None
        for node in layer._inbound_nodes
        for tensor in tf.nest.flatten(node.input_tensors)
    )


def _computes_a_mask(operation):
    """Whether `operation` is a Keras 3 tensor operation whose every output is
    boolean (the functional graph's mask logic): int8 rounds nothing there."""
    if isinstance(operation, keras.layers.Layer):
        return False
    outputs = [
        tensor
        for node in getattr(operation, "_inbound_nodes", [])
        for tensor in tf.nest.flatten(node.output_tensors)
    ]
    return bool(outputs) and all(
        tf.as_dtype(tensor.dtype) == tf.bool for tensor in outputs
    )


def float_input_readers(model):
    """Names of the layers of `model` that read one of its float inputs."""
    floats = {
        id(tensor) for tensor in model.inputs if tf.as_dtype(tensor.dtype).is_floating
    }
    readers = set()
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        for node in layer._inbound_nodes:
            tensors = tf.nest.flatten(node.input_tensors)
            if any(id(tensor) in floats for tensor in tensors):
                readers.add(layer.name)
    return readers


def _rounding_copy(layer, readers):
    config = layer.get_config()
    if type(layer) is keras.layers.Dense and layer.name in readers:
        return QuantizedDense.from_config({**config, "quantize_inputs": True})
    for plain, rounding in REPLACED.items():
        if type(layer) is plain:
            return rounding.from_config(config)
    if isinstance(layer, ROUNDING_LAYERS):
        return type(layer).from_config({**config, "quantize": True})
    return type(layer).from_config(config)


def _quantized_causal_lm(model, kernel_bits=8):
    """`CausalLM(quantize=True)` (or `"int4"`) of `model`'s config, with its
    weights."""
    config = model.get_config()
    if config.get("quantize"):
        raise ValueError(
            f"`model` must be a float CausalLM. Received: {model.name}, which "
            "was built with quantize=True"
        )
    mode = "int4" if kernel_bits == 4 else True
    copy = CausalLM.from_config({**config, "quantize": mode})
    for layer in model.layers:
        if layer.weights:
            _copy_weights(layer, copy.get_layer(layer.name))
    return copy


def _copy_weights(old, new):
    """Assigns `old`'s weights to `new`'s float weights (not its ranges)."""
    source, target = _float_weights(old), _float_weights(new)
    if [tuple(w.shape) for w in source] != [tuple(w.shape) for w in target]:
        raise ValueError(f"{old.name}: the quantized copy's weights differ")
    for value, variable in zip(source, target):
        variable.assign(value)


def _float_weights(layer):
    ranges = {
        id(weight)
        for sub in nested_layers(layer)
        if isinstance(sub, ActivationRange)
        for weight in sub.weights
    }
    return [weight for weight in layer.weights if id(weight) not in ranges]
