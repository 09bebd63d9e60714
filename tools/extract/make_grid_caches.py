#!/usr/bin/env python3
"""Visual KV caches for the 2D-grid evaluation, one fixture folder per entry of the split.

    python3 tools/extract/make_grid_caches.py --split bench/quality/grid_split.json \\
        --out build-grid/caches [--check] [--force] [--only NAME,...]

Entries of the split file (``bench/quality/grid_split.json``):
  * every photo at every size of ``sizes``: ``<photo>_<size>`` (e.g. ``astronaut_224``,
    ``astronaut_448``); 224 gives 1 + 16 x 16 = 257 tokens, 448 gives 1 + 32 x 32 = 1025;
  * every sequence at 224: ``seq_<a>+<b>+..._224``, the images' tokens concatenated along
    N in the order given, each image with its own CLS token.

Each folder is a fixture in the format of ``tests/fixtures/vit_s`` (float16 ``k.npy``,
``v.npy``, ``q.npy`` of shape [4, 6, N, 64] for layers 0, 4, 8, 11, and ``meta.json``),
with these additions to meta.json:
  * ``split``: ``dev`` or ``heldout``; ``image_size``: the side in pixels;
  * ``grid``: ``[[first_token, rows, cols], ...]``, one per image: the index of the
    image's first patch token (its CLS index + 1) and its patch grid (image_size / 14);
  * ``cls_tokens``: the indices of the CLS tokens.
``<out>/index.json`` lists every complete entry (name, split, image_size, images, tokens,
grid, cls_tokens, dir relative to the index's folder, bytes).

A folder that already holds a complete fixture of the same entry is skipped (``--force``
recomputes it). ``--check`` compares every image's saliency map and all Q/K/V with
onnxruntime (slow) and records the result in meta.json; a folder made without the check
is then redone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

import extract_vit
import fixture_io

LAYERS = [0, 4, 8, 11]     # as in tests/fixtures/vit_s (make_fixtures.VIT_LAYERS)
SEQUENCE_SIZE = 224
DTYPE = "float16"


def entries_from_split(split: Dict) -> List[Dict]:
    """The fixtures the split file asks for: photos at every size, then sequences."""
    photo_split = {p["name"]: p["split"] for p in split["photos"]}
    out = []
    for size in split["sizes"]:
        for photo in split["photos"]:
            out.append({"name": f"{photo['name']}_{size}", "split": photo["split"],
                        "image_size": int(size), "images": [photo["name"]]})
    for seq in split["sequences"]:
        for image in seq["images"]:
            if photo_split.get(image) != seq["split"]:
                raise SystemExit(f"sequence {seq['images']} ({seq['split']}) uses {image!r}, "
                                 f"which is {photo_split.get(image, 'not a listed photo')}")
        out.append({"name": f"seq_{'+'.join(seq['images'])}_{SEQUENCE_SIZE}",
                    "split": seq["split"], "image_size": SEQUENCE_SIZE,
                    "images": list(seq["images"])})
    names = [e["name"] for e in out]
    if len(set(names)) != len(names):
        raise SystemExit("the split file lists an entry twice")
    return out


def grid_layout(n_images: int, tokens_per_image: int, image_size: int, patch: int):
    """(grid, cls_tokens) for images laid out as [CLS, rows x cols patches] each."""
    side = image_size // patch
    assert tokens_per_image == 1 + side * side, (tokens_per_image, side)
    cls_tokens = [i * tokens_per_image for i in range(n_images)]
    return [[c + 1, side, side] for c in cls_tokens], cls_tokens


def read_complete(fixture_dir: str, entry: Dict, need_check: bool) -> Optional[Dict]:
    """meta.json of the folder if it holds a complete fixture of ``entry``, else None."""
    try:
        arrays, meta = fixture_io.read_fixture(fixture_dir, mmap=True)
    except (OSError, ValueError, KeyError):
        return None
    same = (meta.get("images") == entry["images"] and meta.get("split") == entry["split"]
            and meta.get("image_size") == entry["image_size"]
            and meta.get("layers") == LAYERS and meta.get("dtype") == DTYPE
            and "grid" in meta and "cls_tokens" in meta
            and all(list(arrays[n].shape) == meta["shapes"][n]
                    for n in fixture_io.ARRAY_NAMES))
    if not same or (need_check and not meta.get("verification_vs_onnxruntime")):
        return None
    return meta


def make_entry(model: extract_vit.VitFocus, entry: Dict, fixture_dir: str, check: bool
               ) -> Dict:
    meta_path = os.path.join(fixture_dir, "meta.json")
    if os.path.exists(meta_path):        # an old or partial fixture: not complete until
        os.remove(meta_path)             # the new meta.json (written last) is there
    q, k, v, info = extract_vit.extract(model, entry["images"], check=check,
                                        size=entry["image_size"])
    meta = extract_vit.build_meta(model, LAYERS, info)
    grid, cls_tokens = grid_layout(len(entry["images"]), info["tokens_per_image"],
                                   entry["image_size"], model.patch)
    meta.update({"split": entry["split"], "grid": grid, "cls_tokens": cls_tokens})
    return fixture_io.write_fixture(fixture_dir, {"k": k[LAYERS], "v": v[LAYERS],
                                                  "q": q[LAYERS]}, meta, DTYPE)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", required=True, help="bench/quality/grid_split.json")
    ap.add_argument("--out", required=True, help="output folder, e.g. build-grid/caches")
    ap.add_argument("--check", action="store_true",
                    help="verify every image against onnxruntime (slow)")
    ap.add_argument("--force", action="store_true", help="recompute complete fixtures too")
    ap.add_argument("--only", default=None,
                    help="comma-separated entry names to make (default: all)")
    args = ap.parse_args(argv)

    with open(args.split, encoding="utf-8") as f:
        entries = entries_from_split(json.load(f))
    wanted = set(args.only.split(",")) if args.only else None
    if wanted and wanted - {e["name"] for e in entries}:
        raise SystemExit(f"not in the split: {sorted(wanted - {e['name'] for e in entries})}")

    t_start = time.time()
    model = None
    os.makedirs(args.out, exist_ok=True)
    index, made = [], 0
    for i, entry in enumerate(entries, 1):
        fixture_dir = os.path.join(args.out, entry["name"])
        todo = wanted is None or entry["name"] in wanted
        meta = None if args.force and todo else read_complete(fixture_dir, entry, args.check
                                                               and todo)
        t0 = time.time()
        if meta is None and todo:
            if model is None:
                model = extract_vit.VitFocus.load()
            meta = make_entry(model, entry, fixture_dir, args.check)
            made += 1
            status = "made"
        elif meta is not None:
            status = "complete, skipped"
        else:
            continue        # not selected by --only and not made yet
        size = fixture_io.dir_size_bytes(fixture_dir)
        n_images = len(entry["images"])
        print(f"[{i}/{len(entries)}] {entry['name']} ({entry['split']}, {entry['image_size']}"
              f"px, {n_images} image{'s' * (n_images > 1)}): {status}, "
              f"{meta['num_tokens']} tokens, {size / 1e6:.2f} MB, {time.time() - t0:.1f}s",
              flush=True)
        index.append({"name": entry["name"], "split": meta["split"],
                      "image_size": meta["image_size"], "images": meta["images"],
                      "tokens": meta["num_tokens"], "grid": meta["grid"],
                      "cls_tokens": meta["cls_tokens"], "dir": entry["name"], "bytes": size})

    total = sum(e["bytes"] for e in index)
    head = {"split_file": args.split, "model": extract_vit.MODEL_NAME, "layers": LAYERS,
            "dtype": DTYPE, "layout": "[L, H, N, d] per fixture folder (k.npy, v.npy, "
            "q.npy, meta.json); dir is relative to this file's folder",
            "total_bytes": total}
    lines = ([f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
             + [' "entries": [', ",\n".join("  " + json.dumps(e) for e in index), " ]"])
    with open(os.path.join(args.out, "index.json"), "w", encoding="utf-8") as f:
        f.write("{\n" + "\n".join(lines) + "\n}\n")     # one line per entry
    print(f"{made} made, {len(index)}/{len(entries)} complete, {total / 1e6:.1f} MB in "
          f"{args.out}; {time.time() - t_start:.1f}s")
    return 0 if len(index) == len(entries) or wanted else 1


if __name__ == "__main__":
    sys.exit(main())
