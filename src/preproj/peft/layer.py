"""PEFT tuner layers: the attention wrapper, with one PreProjAdapter per adapter name, and the norm wrapper
that adds the content skip after an attention-output norm (Gemma-2/3, OLMo-2)."""

from __future__ import annotations

from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from ..core.config import PreProjConfig
from ..core.modules import PreProjAdapter, SkipAfterNorm, SkipRouting

NOT_MERGEABLE = (
    "preproj adapters cannot be merged into the base weights: the pre-projection is nonlinear (act(W_up x̂) feeds "
    "Q, K and V) and the content skip is a new path around attention, so no existing weight can absorb either. "
    "Keep the adapter on the model, or remove it with unload()."
)


class PreProjTunerLayer(BaseTunerLayer):
    def merge(self, safe_merge: bool = False, adapter_names=None) -> None:
        raise ValueError(NOT_MERGEABLE)

    def unmerge(self) -> None:
        raise ValueError(NOT_MERGEABLE)


class PreProjLayer(nn.Module, SkipRouting, PreProjTunerLayer):
    """An attention module with preproj adapters by name; the original stays intact as `base_layer`."""

    adapter_layer_names = ("preproj_adapters",)

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: PreProjConfig, d: int, defer_skip: bool):
        super().__init__()
        self.base_layer = base_layer
        self.preproj_adapters = nn.ModuleDict()
        self.d, self.defer_skip = d, defer_skip
        self.merged_adapters = []
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, config)

    def update_layer(self, adapter_name: str, config: PreProjConfig) -> None:
        device = next(self.base_layer.parameters()).device
        self.preproj_adapters[adapter_name] = PreProjAdapter(self.d, config, device=device)
        self.set_adapter(self.active_adapters)

    def forward(self, *args, **kwargs):
        active = [a for a in self.active_adapters if a in self.preproj_adapters]
        if self.disable_adapters or not active:
            return self.base_layer(*args, **kwargs)
        if len(active) > 1:
            raise ValueError(f"Adapters {active} are active together, but preproj adapters do not add up (each "
                             "changes the input of attention); activate one at a time with set_adapter(name).")
        return self.route(*self.preproj_adapters[active[0]].around(self.base_layer, args, kwargs))


class PreProjNormLayer(SkipAfterNorm, PreProjTunerLayer):
    """The attention-output norm of a Gemma-2/3 or OLMo-2 block, with the content skip added after it. It holds
    no weights of its own: the skip term comes from the layer's PreProjLayer."""

    adapter_layer_names = ()

    def __init__(self, base_layer: nn.Module, attention: PreProjLayer):
        super().__init__(base_layer, attention)
        self.merged_adapters = []
