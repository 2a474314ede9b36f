"""Checkpoint loading (docs/formats.md layout, transformers KimiLinear save_pretrained output)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from . import ops


def canonical_name(name: str) -> str:
    """Strip the VLM prefix: `language_model.model.X` / `language_model.layers.X` / `model.X` -> `model.X`."""
    if name.startswith("language_model."):
        name = name[len("language_model."):]
    if name.startswith("layers."):
        name = "model." + name
    return name


def read_safetensors(model_dir: Path) -> dict:
    model_dir = Path(model_dir)
    idx = model_dir / "model.safetensors.index.json"
    if idx.exists():
        files = sorted(set(json.loads(idx.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        for k, v in load_file(str(model_dir / f)).items():
            out[canonical_name(k)] = v
    return out


def load_weights(model_dir: Path, cfg=None) -> dict:
    """All tensors by canonical name; MXFP4 `X.weight_packed`/`X.weight_scale` pairs become dense `X.weight`
    (float64, exact). Other floating tensors are returned as stored (the model casts them)."""
    raw = read_safetensors(model_dir)
    out = {}
    for k, v in raw.items():
        if k.endswith(".weight_packed"):
            base = k[: -len(".weight_packed")]
            out[base + ".weight"] = ops.mxfp4_decode(v, raw[base + ".weight_scale"], torch.float64)
        elif k.endswith(".weight_scale") and (k[: -len(".weight_scale")] + ".weight_packed") in raw:
            continue
        else:
            out[k] = v
    return out
