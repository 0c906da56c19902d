"""hessviz: exact closed-form Hessians of a Transformer block.

>>> import hessviz as hv
>>> cfg = hv.BlockConfig(seq_len=4, d_model=8, d_k=4, d_ff=16, norm="post")
>>> params = hv.init_params(cfg, seed=0)
>>> X, Y = hv.sample_inputs(cfg, seed=0, input_norm=1.0)
>>> res = hv.hessian(cfg, params, X, Y)
>>> res.full.shape == (cfg.num_params, cfg.num_params)
True
>>> bool((res.full - res.outer - res.functional).abs().max() < 1e-12)
True
"""

from hessviz.api import forward, gradient, hessian, jacobian, loss
from hessviz.block.config import BlockConfig
from hessviz.block.inputs import init_params, sample_inputs
from hessviz.errors import CheckpointError, ConfigError, HessvizError, InputError, SizeError
from hessviz.losses import MSE, Classifier, CrossEntropy, CustomLoss, Loss, NextToken
from hessviz.pretrained import layer_for_text, layer_inputs, load_layer
from hessviz.products.hessian_operator import HessianOperator
from hessviz.result import HessianResult
from hessviz.runtime.memory import memory_limit, set_memory_limit
from hessviz.whole import Model, ModelHessian, load_model, model_hessian

__version__ = "0.1.0"

__all__ = [
    "BlockConfig",
    "CheckpointError",
    "Classifier",
    "ConfigError",
    "CrossEntropy",
    "CustomLoss",
    "HessianOperator",
    "HessianResult",
    "HessvizError",
    "InputError",
    "Loss",
    "MSE",
    "Model",
    "ModelHessian",
    "NextToken",
    "SizeError",
    "forward",
    "gradient",
    "hessian",
    "init_params",
    "jacobian",
    "layer_for_text",
    "layer_inputs",
    "load_layer",
    "load_model",
    "loss",
    "memory_limit",
    "model_hessian",
    "sample_inputs",
    "set_memory_limit",
]
