"""Standalone export: an adapted model as a transformers model directory that loads without preproj."""

from .writer import ExportError, export

__all__ = ["export", "ExportError"]
