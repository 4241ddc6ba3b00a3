"""Whether the Hugging Face Hub can be asked at all, decided in a few seconds instead of after minutes of retries."""

from __future__ import annotations

import os
import socket
from functools import lru_cache

HUB_HOST = "huggingface.co"


@lru_cache(maxsize=1)
def reachable(timeout: float = 3.0) -> bool:
    """False when offline mode is set (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) or the Hub's host does not answer."""
    if any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
           for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False


def cached(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds this model's config (then it loads offline)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id the hub library refuses is simply not cached
        return False
