"""The package's layers, one public layer per module (`keras_posenc.layers`)."""

from keras_posenc.layers.activation_range import ActivationRange
from keras_posenc.layers.combined_position_input import (
    CombinedPositionInput,
    combined_attention_input,
)
from keras_posenc.layers.contextual_position import ContextualPosition
from keras_posenc.layers.data_adaptive_bias import DataAdaptiveBias
from keras_posenc.layers.decoder_attention import DecoderAttention
from keras_posenc.layers.dynamic_position_bias import DynamicPositionBias
from keras_posenc.layers.feed_forward import FeedForward
from keras_posenc.layers.fire_bias import FireBias
from keras_posenc.layers.forgetting_gate import ForgettingGate
from keras_posenc.layers.gated_position_fusion import (
    GatedPositionFusion,
    gated_position_fusion,
)
from keras_posenc.layers.hierarchical_position_network import (
    HierarchicalPositionNetwork,
)
from keras_posenc.layers.kerple_bias import KerpleBias
from keras_posenc.layers.layer_norm import LayerNorm
from keras_posenc.layers.learned_position_embedding import LearnedPositionEmbedding
from keras_posenc.layers.mean_pooling import MeanPooling
from keras_posenc.layers.quantized_add import QuantizedAdd
from keras_posenc.layers.quantized_dense import QuantizedDense
from keras_posenc.layers.recursive_position_update import RecursivePositionUpdate
from keras_posenc.layers.relative_multi_head_attention import (
    RelativeMultiHeadAttention,
)
from keras_posenc.layers.relative_position_bias import RelativePositionBias
from keras_posenc.layers.rms_norm import RMSNorm
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.segment_positions import SegmentPositions
from keras_posenc.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)
from keras_posenc.layers.token_embedding import TokenEmbedding

__all__ = [
    "ActivationRange",
    "CombinedPositionInput",
    "ContextualPosition",
    "DataAdaptiveBias",
    "DecoderAttention",
    "DynamicPositionBias",
    "FeedForward",
    "FireBias",
    "ForgettingGate",
    "GatedPositionFusion",
    "HierarchicalPositionNetwork",
    "KerpleBias",
    "LayerNorm",
    "LearnedPositionEmbedding",
    "MeanPooling",
    "QuantizedAdd",
    "QuantizedDense",
    "RecursivePositionUpdate",
    "RelativeMultiHeadAttention",
    "RelativePositionBias",
    "RMSNorm",
    "RotaryEmbedding",
    "SegmentPositions",
    "SinusoidalPositionEncoding",
    "TokenEmbedding",
    "combined_attention_input",
    "gated_position_fusion",
]
