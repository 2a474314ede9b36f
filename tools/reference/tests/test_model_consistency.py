"""Loader spellings (docs/formats.md) and cache consistency of the whole K3.1 model (DSA path)."""
import json

import torch
from safetensors.torch import load_file, save_file

from conftest import rel_err
from k31ref import Model, randinit


def _tiny(tmp_path, topk=8):
    tc = randinit.tiny_text_config(vocab_size=512, index_topk=topk)
    w = randinit.random_k31_weights(tc, seed=555)
    randinit.save_k31_checkpoint(tmp_path / "base", tc, w)
    return tc, w


def test_loader_spellings_and_shards(tmp_path, measure):
    tc, w = _tiny(tmp_path)
    ids = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(1))
    ref = Model.load(tmp_path / "base").forward(ids)
    raw = load_file(str(tmp_path / "base" / "model.safetensors"))
    cfg = (tmp_path / "base" / "config.json").read_text()
    # (1) no prefix, (2) `language_model.layers.` spelling, both sharded through an index
    for tag, rename in (("plain", lambda k: k[len("language_model."):]),
                        ("short", lambda k: k.replace("language_model.model.layers.", "language_model.layers."))):
        d = tmp_path / tag
        d.mkdir()
        (d / "config.json").write_text(cfg)
        names = sorted(raw)
        shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        wm = {}
        for f, ns in shards.items():
            save_file({rename(k): raw[k] for k in ns}, str(d / f))
            wm.update({rename(k): f for k in ns})
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
        out = Model.load(d).forward(ids)
        measure(f"loader: {tag} names, 2 shards vs prefixed single file", rel_err(out, ref), 0)


def test_cache_consistency_with_dsa(tmp_path, measure):
    """topk 8 < T: full forward == prefill 5 + chunk 12 + single steps == decode only (float64)."""
    _tiny(tmp_path, topk=8)
    m = Model.load(tmp_path / "base")
    ids = torch.randint(0, 512, (30,), generator=torch.Generator().manual_seed(2))
    rec = {}
    full = m.forward(ids, None, rec)
    assert (rec["layers.7.indexer.selected"][20] >= 0).sum() == 8  # sparse rows really exist
    cache = m.new_cache()
    parts = [m.forward(ids[:5], cache), m.forward(ids[5:17], cache)]
    parts += [m.forward(ids[t:t + 1], cache) for t in range(17, 30)]
    measure("K3.1 tiny (topk 8): prefill 5 + chunk 12 + 13 decode steps vs full (f64)",
            rel_err(torch.cat(parts), full), 1e-12)
    measure("K3.1 tiny (topk 8): decode only vs full (f64)", rel_err(m.logits_incremental(ids, 1), full), 1e-12)
