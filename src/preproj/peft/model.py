"""PreProjModel: the PEFT tuner that wraps each adapted attention module in a PreProjLayer.

Targets come from preproj's family table (or PreProjConfig.structure), not from target_modules patterns,
and the weights are saved under preproj's family-independent keys (layers.{i}.preproj.up.weight, ...),
so a PEFT-saved adapter and one written by preproj.save_adapter are the same two files.
"""

from __future__ import annotations

import re

from peft.tuners.tuners_utils import BaseTuner
from torch import nn

from ..core.adapter import AdapterError, adapter_metadata, check_compatible
from ..core.families import check_structure, decoder_layers, family_of, hidden_size
from .config import PreProjPeftConfig
from .layer import NOT_MERGEABLE, PreProjLayer, PreProjNormLayer, PreProjTunerLayer

PREFIX = "preproj_"


def _module_path(model: nn.Module, module: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


class PreProjModel(BaseTuner):
    prefix = PREFIX
    tuner_layer_cls = PreProjTunerLayer
    target_module_mapping: dict = {}

    def _prepare_adapter_config(self, peft_config: PreProjPeftConfig, model_config: dict) -> PreProjPeftConfig:
        model = self.model
        if getattr(model, "preproj_config", None) is not None:
            raise ValueError("This model already carries an adapter from preproj.attach; call preproj.detach(model) "
                             "before get_peft_model.")
        config = peft_config.preproj_config()
        family = family_of(model, config)
        layers = decoder_layers(model, family)
        if not any(isinstance(m, PreProjTunerLayer) for m in model.modules()):
            check_structure(model, family)
        recorded = {k: getattr(peft_config, k) for k in ("family", "hidden_size", "num_hidden_layers")}
        if any(v is not None for v in recorded.values()):
            try:
                check_compatible(recorded, model, "this PreProjPeftConfig", config)
            except AdapterError as e:
                raise ValueError(str(e)) from None
        for key, value in adapter_metadata(model, config).items():
            if key != "base_model_name_or_path" or peft_config.base_model_name_or_path is None:
                setattr(peft_config, key, value)
        indices = range(len(layers)) if config.layers is None else config.layers
        bad = [i for i in indices if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(f"PreProjConfig.layers {bad} out of range: the model has {len(layers)} layers "
                             f"(0..{len(layers) - 1}).")
        path = _module_path(model, layers)
        names = [family.attention] + ([family.skip_after] if family.skip_after else [])
        peft_config.target_modules = "|".join(re.escape(f"{path}.{i}.{n}") for i in indices for n in names)
        self._family, self._d = family, hidden_size(model)
        return peft_config

    @staticmethod
    def _check_target_module_exists(peft_config: PreProjPeftConfig, key: str) -> bool:
        return re.fullmatch(peft_config.target_modules, key) is not None

    def _create_and_replace(self, peft_config, adapter_name, target, target_name, parent, current_key,
                            parameter_name=None) -> None:
        family = self._family
        if isinstance(target, PreProjNormLayer):
            return
        if isinstance(target, PreProjLayer):
            target.update_layer(adapter_name, peft_config.preproj_config())
            return
        if target_name == family.skip_after:
            new = PreProjNormLayer(target, getattr(parent, family.attention))
        else:
            new = PreProjLayer(target, adapter_name, peft_config.preproj_config(), self._d,
                               defer_skip=family.skip_after is not None)
        self._replace_module(parent, target_name, new, target)

    def _replace_module(self, parent, child_name, new_module, child) -> None:
        if not isinstance(new_module, PreProjTunerLayer):  # unload: the original module goes back as it was
            setattr(parent, child_name, new_module)
            return
        super()._replace_module(parent, child_name, new_module, child)

    def _check_merge_allowed(self):
        raise ValueError(NOT_MERGEABLE)

    @classmethod
    def _remove_adapter_name_from_key(cls, key: str, adapter_name: str) -> str:
        # base_model.model.model.layers.3.self_attn.preproj_adapters.default.preproj.up.weight
        #   -> layers.3.preproj.up.weight: the keys preproj.save_adapter writes, whatever the family.
        head, sep, tail = key.partition(f".preproj_adapters.{adapter_name}.")
        if not sep:
            return super()._remove_adapter_name_from_key(key, adapter_name)
        index = next(part for part in reversed(head.split(".")) if part.isdigit())
        return f"layers.{index}.{tail}"
