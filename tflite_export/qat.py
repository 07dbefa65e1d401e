"""Quantization-aware training: the package's own (both Keras) or TF-MOT's.

`quantize_aware(model)` uses the package's fake quantizers
(`keras_posenc.training.quantization`); `quantize_aware(model,
engine="tfmot")` uses TF-MOT (Keras 2 only), as described below.

TF-MOT is imported lazily, here only: importing it switches the process to
Keras 2 (`TF_USE_LEGACY_KERAS=1`). Its wrapper forwards one input tensor plus
keyword arguments, so every keras_posenc layer called that way (the builders'
self-attention, `hpn(x, layer_idx=...)`, norms, embeddings) is wrapped with
`PosencQuantizeConfig`: the kernels it owns, including those of nested Dense
and convolution sublayers, are fake-quantized (int8, symmetric, per tensor)
and its output is fake-quantized (int8, moving-average range). Layers called
with two tensors, and the tensors computed inside `call` (logits, softmax,
biases), get their int8 ranges from the representative data at conversion.
"""

import keras_posenc
from keras_posenc.utils import keras, nested_layers, package_classes, require_tensorflow

#: `(layer class, attribute)` of the kernels QAT fake-quantizes.
QUANTIZED_KERNELS = (
    (keras.layers.Dense, "kernel"),
    (keras.layers.DepthwiseConv1D, "depthwise_kernel"),
    (keras_posenc.TokenEmbedding, "embeddings"),
    (keras_posenc.LearnedPositionEmbedding, "embeddings"),
)
#: Gathers keep their table's scale: no output quantizer.
TABLE_LOOKUPS = (keras_posenc.TokenEmbedding, keras_posenc.LearnedPositionEmbedding)


class QuantizationError(RuntimeError):
    """Quantization-aware training is unavailable in this process."""


#: Who inserts the fake quantizers: the package itself (Keras 3 and Keras 2)
#: or TF-MOT (Keras 2 only).
ENGINES = ("posenc", "tfmot")


def quantize_aware(model, engine="posenc", kernel_bits=8):
    """A quantization-aware copy of `model`, with its weights.

    With `engine="posenc"` (the default, Keras 3 and Keras 2) every tensor the
    full-int8 TFLite model rounds passes a fake quantizer
    (`keras_posenc.training.quantization.quantize_model`): kernels, layer
    outputs, and inside attention the logits, the bias, the softmax and the
    context; `convert(qat_model, None, mode="int8")` then needs no data. It
    takes models of the layers whose rounding is modelled (see
    `quantize_model`) and refuses others, naming them, before any work. A
    `CausalLM` becomes a `CausalLM(quantize=True)` (its caches rounded too),
    for `convert_causal_lm(qat_model, None)`.

    With `engine="tfmot"` (Keras 2 only) TF-MOT wraps the kernels and layer
    outputs it can reach; tensors inside `call` get their ranges from the
    representative data at conversion.

    Args:
        model: a float functional `keras.Model` (built by hand from the
            package's layers, or by `keras_posenc.models`), or a `CausalLM`
            (`engine="posenc"` only).
        engine: `"posenc"` or `"tfmot"`.
        kernel_bits: 8, or 4 for a `CausalLM` (`CausalLM(quantize="int4")`:
            its projections train on the 4-bit grid `mode="int4"` stores).
            Defaults to `8`.

    Returns:
        A `keras.Model` ready for `compile` and `fit`, then for
        `tflite_export.convert`.
    """
    require_tensorflow("quantize_aware")
    if engine not in ENGINES:
        raise ValueError(
            f"`engine` must be one of {ENGINES}. Received: engine={engine!r}"
        )
    from keras_posenc.training.quantization import check_float32, quantize_model

    if engine == "tfmot" and kernel_bits != 8:
        raise ValueError(
            "`kernel_bits` must be 8 with engine='tfmot' (its kernels are "
            f"int8). Received: kernel_bits={kernel_bits!r}"
        )
    if engine == "posenc":
        return quantize_model(model, kernel_bits)
    if keras_posenc.IS_KERAS_3:
        raise QuantizationError(
            "engine='tfmot' needs Keras 2: TF-MOT rejects Keras 3 "
            "models. Set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported "
            "(for example `TF_USE_LEGACY_KERAS=1 python train.py`), or use "
            "engine='posenc', which runs in both"
        )
    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a keras.Model. Received: model={model!r}")
    check_float32(model)
    tfmot = _tfmot()
    qk = tfmot.quantization.keras
    wrapped = [
        layer.name
        for layer in nested_layers(model)
        if isinstance(layer, qk.QuantizeWrapper)
        or isinstance(layer, keras_posenc.layers.ActivationRange)
    ]
    if wrapped:
        raise ValueError(
            "`model` must be a float model: a second quantization-aware copy "
            "would start its ranges afresh and drop the trained ones. Received: "
            f"{model.name}, already quantization-aware ({', '.join(wrapped[:4])})"
        )
    config_class = _config_class(qk)
    registry = _default_registry()
    ours = tuple(package_classes().values())

    def annotate(layer):
        if _reads_integers(layer):
            return layer  # TF-MOT would fake-quantize the int32 token ids
        if isinstance(layer, ours) and _single_tensor_calls(layer):
            return qk.quantize_annotate_layer(layer, config_class())
        if not isinstance(layer, keras.layers.InputLayer) and registry.supports(layer):
            return qk.quantize_annotate_layer(layer)
        return layer

    annotated = keras.models.clone_model(model, clone_function=annotate)
    scope = dict(package_classes(), PosencQuantizeConfig=config_class)
    with qk.quantize_scope(scope):
        return qk.quantize_apply(annotated)


def quantize_scope():
    """The scope that loads a saved QAT model (`with quantize_scope(): load`)."""
    qk = _tfmot().quantization.keras
    return qk.quantize_scope(
        dict(package_classes(), PosencQuantizeConfig=_config_class(qk))
    )


def weight_owners(layer):
    """`[(owner layer, attribute)]` of the kernels QAT fake-quantizes."""
    return [
        (sublayer, attribute)
        for sublayer in nested_layers(layer)
        for kind, attribute in QUANTIZED_KERNELS
        if isinstance(sublayer, kind)
    ]


def _config_class(qk):
    quantizers = qk.quantizers

    class PosencQuantizeConfig(qk.QuantizeConfig):
        """Fake-quantizes a keras_posenc layer's kernels and its output."""

        def get_weights_and_quantizers(self, layer):
            _build_self_attention(layer)
            kernel = quantizers.LastValueQuantizer(
                num_bits=8, symmetric=True, narrow_range=False, per_axis=False
            )
            return [
                (getattr(owner, attribute), kernel)
                for owner, attribute in weight_owners(layer)
                if getattr(owner, "built", False)
            ]

        def get_activations_and_quantizers(self, layer):
            return []

        def set_quantize_weights(self, layer, quantize_weights):
            owners = [
                (owner, attribute)
                for owner, attribute in weight_owners(layer)
                if getattr(owner, "built", False)
            ]
            for (owner, attribute), weight in zip(owners, quantize_weights):
                setattr(owner, attribute, weight)

        def set_quantize_activations(self, layer, quantize_activations):
            return None

        def get_output_quantizers(self, layer):
            if isinstance(layer, TABLE_LOOKUPS):
                return []
            return [
                quantizers.MovingAverageQuantizer(
                    num_bits=8, symmetric=False, narrow_range=False, per_axis=False
                )
            ]

        def get_config(self):
            return {}

    return PosencQuantizeConfig


def _build_self_attention(layer):
    """Builds key/value projections that Keras 2 leaves for the first call.

    A wrapped attention is always called as self-attention (one tensor), so
    its key and value projections see the query's width.
    """
    attentions = [
        sublayer
        for sublayer in nested_layers(layer)
        if isinstance(sublayer, keras_posenc.RelativeMultiHeadAttention)
    ]
    for attention in attentions:
        width = attention.query_dense.kernel.shape[0]
        for dense in (attention.key_dense, attention.value_dense):
            if dense is not None and not dense.built:  # LSH has no key_dense
                dense.build((None, None, width))


def _single_tensor_calls(layer):
    """Whether every call of `layer` in its model passed one tensor."""
    for node in getattr(layer, "_inbound_nodes", []):
        args = getattr(node, "call_args", ())
        if len(args) != 1 or isinstance(args[0], (list, tuple)):
            return False
    return True


def _reads_integers(layer):
    """Whether `layer` consumes integer tensors (token ids)."""
    for node in getattr(layer, "_inbound_nodes", []):
        for tensor in getattr(node, "call_args", ())[:1]:
            if getattr(tensor, "dtype", None) is not None and tensor.dtype.is_integer:
                return True
    return False


def _default_registry():
    """TF-MOT's registry of the standard Keras layers it quantizes itself."""
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (  # noqa: E501
        default_8bit_quantize_registry as registry,
    )

    return registry.Default8BitQuantizeRegistry()


def _tfmot():
    try:
        import tensorflow_model_optimization as tfmot
    except ImportError as error:  # pragma: no cover - an install problem
        raise QuantizationError(
            "Quantization-aware training needs tensorflow-model-optimization: "
            "pip install 'keras_posenc[export]'"
        ) from error
    return tfmot
