"""Writing and reading KV-cache fixtures: a folder with k.npy, v.npy, q.npy and meta.json.

Layout contract (shared by extract_llm.py, extract_vit.py, test_extract.py and the C++
side that loads these files):

* ``k.npy`` and ``v.npy``: ``[L, H_kv, N, d]``, C-order, keys after RoPE (if the model
  uses RoPE), values as the attention consumes them.
* ``q.npy``: ``[L, H_q, N, d]``, C-order, queries after RoPE, *unscaled* (the softmax
  scale is in ``meta.json`` as ``softmax_scale``).
* ``meta.json``: everything needed to interpret the arrays; ``shapes`` and ``dtype`` repeat
  what the .npy headers say so that a consumer can check consistency.

Only numpy and the standard library are used here.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

import _paths  # noqa: F401  (tools/ on sys.path: the smollm2 package)
import numpy as np
from smollm2.packages import package_file  # noqa: F401  (extract_vit.py reads it from here)

FORMAT_TAG = "flashcache-kv-fixture/1"
ARRAY_NAMES = ("k", "v", "q")


def write_fixture(out_dir: str, arrays: Dict[str, np.ndarray], meta: Dict[str, Any],
                  dtype: str = "float16") -> Dict[str, Any]:
    """Save ``arrays`` (k, v, q) as C-order .npy files of ``dtype`` plus ``meta.json``.

    ``meta`` is completed with the format tag, dtype, layout string and shapes. Returns
    the completed meta dictionary.
    """
    os.makedirs(out_dir, exist_ok=True)
    np_dtype = np.dtype(dtype)
    shapes = {}
    for name in ARRAY_NAMES:
        arr = np.ascontiguousarray(arrays[name], dtype=np_dtype)
        if arr.ndim != 4:
            raise ValueError(f"{name} must be 4-D [L, H, N, d], got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} has non-finite values after the cast to {dtype}")
        np.save(os.path.join(out_dir, f"{name}.npy"), arr)
        shapes[name] = list(arr.shape)

    full_meta = {"format": FORMAT_TAG,
                 "dtype": np_dtype.name,
                 "layout": "[L, H, N, d], C-order (k, v: H = num_kv_heads; q: H = num_q_heads)",
                 "shapes": shapes}
    full_meta.update(meta)
    with open(os.path.join(out_dir, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(full_meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return full_meta


def read_fixture(fixture_dir: str, mmap: bool = False):
    """Load a fixture folder; returns ``(arrays, meta)`` with arrays keyed k, v, q."""
    with open(os.path.join(fixture_dir, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    mode = "r" if mmap else None
    arrays = {name: np.load(os.path.join(fixture_dir, f"{name}.npy"), mmap_mode=mode)
              for name in ARRAY_NAMES}
    return arrays, meta


def dir_size_bytes(path: str) -> int:
    """Total size of the regular files directly inside ``path``."""
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
               if os.path.isfile(os.path.join(path, n)))


