"""A vision model as a directory, laid out as transformers lays one out: config.json (its shape) and
model.safetensors; the method's files go to adapter/ beside them, as for text."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from ..runtime.files import write_json


class SavedAsDirectory:
    """save_pretrained and from_pretrained for a model built from one frozen shape dataclass (`self.shape`)."""

    model_type: str
    shape_type: type

    def save_pretrained(self, out: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        state = state_dict if state_dict is not None else self.state_dict()
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
        write_json(out / "config.json", {"model_type": self.model_type, "shape": asdict(self.shape)})

    @classmethod
    def from_pretrained(cls, directory: str | Path):
        """The model save_pretrained wrote (without the method: load_adapter(model, directory / "adapter") adds it)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        try:
            config = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{directory} holds no readable config.json of a preproj vision model ({e}).") from None
        if config.get("model_type") != cls.model_type:
            raise ValueError(f"{directory}/config.json is not a {cls.__name__}'s (model_type "
                             f"{config.get('model_type')!r}, expected {cls.model_type!r}).")
        model = cls(cls.shape_type(**config["shape"]))
        model.load_state_dict(load_file(str(directory / "model.safetensors")))
        return model
