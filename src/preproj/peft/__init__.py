"""preproj as a PEFT method: `get_peft_model(model, PreProjPeftConfig())`, `save_pretrained`,
`PeftModel.from_pretrained`, adapter disable/enable and `transformers.Trainer` work as for LoRA.

Importing this module registers the method with PEFT (peft >= 0.21, whose state-dict handling a tuner
class defines itself; older versions hard-code their own methods). The saved files are the ones
preproj.save_adapter writes, so either side loads the other's. Merging refuses: the modules are nonlinear.
"""

from __future__ import annotations

from importlib.metadata import version

from packaging.version import Version

MIN_PEFT = "0.21"
if Version(version("peft")) < Version(MIN_PEFT):
    raise ImportError(
        f"preproj.peft needs peft >= {MIN_PEFT} (found {version('peft')}): older PEFT versions cannot take a method "
        f"registered from outside. Upgrade with `pip install 'peft>={MIN_PEFT}'`, or use preproj.attach, "
        "preproj.save_adapter and preproj.load_adapter, which need no PEFT."
    )

from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_PREFIX_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING  # noqa: E402

from ..core.adapter import PEFT_TYPE  # noqa: E402
from .config import PreProjPeftConfig  # noqa: E402
from .layer import PreProjLayer, PreProjNormLayer  # noqa: E402
from .model import PREFIX, PreProjModel  # noqa: E402

# peft.register_peft_method only accepts names in its own PeftType enum; these three tables are what it fills.
PEFT_TYPE_TO_CONFIG_MAPPING[PEFT_TYPE] = PreProjPeftConfig
PEFT_TYPE_TO_TUNER_MAPPING[PEFT_TYPE] = PreProjModel
PEFT_TYPE_TO_PREFIX_MAPPING[PEFT_TYPE] = PREFIX

__all__ = ["PreProjPeftConfig", "PreProjModel", "PreProjLayer", "PreProjNormLayer", "MIN_PEFT"]
