"""A transformers causal LM with preproj's pre-projection and content skip around its attention layers.

Written into a model directory by `preproj export`, beside preproj_modules.py (the modules and the wrapper); the two
need torch and transformers only. Load the directory with
`AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)`. The model is the base architecture's own
transformers class; in each adapted layer the attention module is wrapped as preproj's `attach` wraps it:

    x̂  = Norm(x)                                 the block's own attention-input norm
    x̃  = x̂ + W_down · act(W_up · x̂)             pre-projection, before Q/K/V (and before RoPE)
    out = x + attn(x̃) + W_skip · x̃              content skip, added to the attention output

A model trained with one of the block changes preproj compares the skip with (gated attention, the value residual,
the pre-attention MLP) carries them too, through hooks (preproj_modules.py says how).

config.json's `preproj` entry says which layers are adapted, where they live and the modules' sizes.
"""

from __future__ import annotations

from transformers import LlamaConfig as BaseConfig  # preproj export: the base model's config class
from transformers import LlamaForCausalLM as BaseForCausalLM  # preproj export: the base model's class

from .preproj_modules import adapt


class PreProjConfig(BaseConfig):
    """The base model's config, plus `preproj`: {"mode", "hidden_width", "activation", "adapted_layers",
    "decoder_layers", "attention", "skip_after"}."""

    model_type = "preproj_" + BaseConfig.model_type


class PreProjForCausalLM(BaseForCausalLM):
    config_class = PreProjConfig

    def __init__(self, config: PreProjConfig):
        super().__init__(config)
        adapt(self, config.preproj, config.hidden_size)
