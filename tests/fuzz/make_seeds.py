#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/<target>/ (small files, committed).

Run again after changing a target's input format: python3 tests/fuzz/make_seeds.py
Needs only the standard library, so the seeds do not depend on a NumPy version.
"""
import hashlib
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

ITEM = {"<f4": ("f", 4), "<f2": ("e", 2), "<f8": ("d", 8), "<i4": ("i", 4), "<i8": ("q", 8), "|u1": ("B", 1),
        "|b1": ("?", 1)}


def npy(descr, shape, values=None, major=1, dict_text=None):
    """A .npy file as NumPy writes it: magic, version, padded header, little-endian data."""
    if dict_text is None:
        dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
        dict_text = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    prefix = 10 if major == 1 else 12
    total = (prefix + len(dict_text) + 1 + 63) // 64 * 64
    header = dict_text + " " * (total - prefix - len(dict_text) - 1) + "\n"
    length = struct.pack("<H", len(header)) if major == 1 else struct.pack("<I", len(header))
    count = 1
    for d in shape:
        count *= d
    fmt, _ = ITEM[descr]
    if values is None:
        values = [((i * 37) % 17 - 8) / 4.0 for i in range(count)]
        if fmt in "iqB?":
            values = [int(abs(v) * 4) % (2 if fmt == "?" else 256) for v in values]
    data = struct.pack("<%d%s" % (count, fmt), *values)
    return b"\x93NUMPY" + bytes([major, 0]) + length + header.encode("latin1") + data


def write(target, content):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    name = hashlib.sha1(content).hexdigest()[:16]
    with open(os.path.join(folder, name), "wb") as f:
        f.write(content)


def npy_seeds():
    for descr in ITEM:
        write("fuzz_npy", npy(descr, (2, 3)))
    write("fuzz_npy", npy("<f4", ()))
    write("fuzz_npy", npy("<f4", (0,)))
    write("fuzz_npy", npy("<f2", (2, 2, 4, 3)))
    write("fuzz_npy", npy("<f4", (3,), major=2))
    write("fuzz_npy", npy("<i8", (2,), major=3))
    write("fuzz_npy", npy("<f4", (2, 1), dict_text="{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(2L, 1L)}"))
    write("fuzz_npy", npy("|u1", (4,), dict_text="{'shape': (4,), 'fortran_order': False, 'descr': '=u1'}"))


def cli_input(args, files):
    """fuzz_cli's format: arguments one per line, NUL, then (name index, u16 length, bytes) per file."""
    names = {"k.npy": 0, "v.npy": 1, "q.npy": 2, "m.npy": 3}
    out = "\n".join(args).encode() + b"\0"
    for name, content in files.items():
        out += bytes([names[name]]) + struct.pack("<H", len(content)) + content
    return out


def cli_seeds():
    L, H, N, d = 2, 2, 12, 4
    kv32 = {"k.npy": npy("<f4", (L, H, N, d)), "v.npy": npy("<f4", (L, H, N, d))}
    kv16 = {"k.npy": npy("<f2", (H, N, d)), "v.npy": npy("<f2", (H, N, d))}
    base = ["compress", "--k", "k.npy", "--v", "v.npy", "--out", "out"]
    write("fuzz_cli", cli_input(base, kv32))
    write("fuzz_cli", cli_input(base + ["--keep-ratio", "0.5"], kv16))
    write("fuzz_cli", cli_input(base + ["--keep", "5", "--sink", "1", "--window", "2"], kv32))
    write("fuzz_cli", cli_input(base + ["--no-allocate", "--transform", "blocked", "--block", "5", "--gamma", "0.3"],
                                kv32))
    mask = npy("|b1", (N,), [i % 5 == 0 for i in range(N)])
    write("fuzz_cli", cli_input(base + ["--protect", "m.npy", "--keep-ratio", "0.4"], dict(kv32, **{"m.npy": mask})))
    q = npy("<f4", (L, 2 * H, N, d))
    write("fuzz_cli", cli_input(base + ["--policy", "snapkv", "--q", "q.npy", "--observation-window", "4"],
                                dict(kv32, **{"q.npy": q})))
    write("fuzz_cli", cli_input(base + ["--policy", "h2o", "--q", "q.npy"], dict(kv32, **{"q.npy": q})))
    write("fuzz_cli", cli_input(base + ["--policy", "random", "--seed", "7", "--force"], kv32))
    write("fuzz_cli", cli_input(base + ["--policy", "knorm"], kv16))
    write("fuzz_cli", cli_input(base + ["--policy", "streaming", "--keep", "3"], kv32))
    write("fuzz_cli", cli_input(["inspect", "--k", "k.npy", "--v", "v.npy"], kv32))
    write("fuzz_cli", cli_input(["inspect", "--k", "k.npy", "--v", "v.npy", "--transform", "blocked"], kv16))
    write("fuzz_cli", cli_input(["compress", "--help"], {}))


def compress_seeds():
    # fuzz_compress decodes with FuzzedDataProvider: any bytes are an input; these just start it off varied.
    rng = random.Random(13)
    for n in (16, 32, 64, 128, 256, 512):
        for _ in range(3):
            write("fuzz_compress", bytes(rng.randrange(256) for _ in range(n)))


class Gguf:
    """GGUF bytes field by field (little-endian), as the engine's reader expects them."""
    U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)

    def __init__(self):
        self.b = b""

    def put(self, fmt, *v):
        self.b += struct.pack("<" + fmt, *v)
        return self

    def str(self, s):
        data = s.encode("utf-8")
        return self.put("Q", len(data)).raw(data)

    def raw(self, data):
        self.b += data
        return self

    def key(self, k, t):
        return self.str(k).put("I", t)

    def strings(self, k, items):
        self.key(k, self.ARR).put("I", self.STR).put("Q", len(items))
        for it in items:
            self.str(it)
        return self

    def ints(self, k, items):
        self.key(k, self.ARR).put("I", self.I32).put("Q", len(items))
        return self.put("%di" % len(items), *items)

    def align(self, a):
        self.b += b"\0" * (-len(self.b) % a)
        return self


def gguf_file(with_tokenizer=True, version=3):
    # Tensors: F32 [4, 2], F16 [8], BF16 [2, 2], Q8_0 [32], Q4_0 [32], Q4_1 [32, 2].
    tensors = [("f32", [4, 2], 0, struct.pack("<8f", *[0.5 * i for i in range(8)])),
               ("f16", [8], 1, struct.pack("<8e", *[i - 4.0 for i in range(8)])),
               ("bf16", [2, 2], 30, struct.pack("<4H", 0x3F80, 0xBF80, 0x4000, 0)),
               ("q8", [32], 8, struct.pack("<e", 0.5) + bytes(range(32))),
               ("q4", [32], 2, struct.pack("<e", 0.25) + bytes(range(16))),
               ("q41", [32, 2], 3, (struct.pack("<ee", 0.5, -1.0) + bytes(range(16, 32))) * 2)]
    # A byte-level vocabulary: the 256 byte characters, a few merges, ChatML specials.
    byte_chars = []
    extra = 0
    for b in range(256):
        printable = ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF
        byte_chars.append(chr(b if printable else 256 + extra))
        extra += 0 if printable else 1
    merges = ["H e", "l l", "He ll", "o ,", "\u0120 w"]
    vocab = byte_chars + ["He", "ll", "Hell", "o,", "\u0120w", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    types = [1] * (len(vocab) - 3) + [3, 3, 3]
    meta = [("general.architecture", lambda g: g.key("general.architecture", g.STR).str("llama")),
            ("general.alignment", lambda g: g.key("general.alignment", g.U32).put("I", 32)),
            ("llama.context_length", lambda g: g.key("llama.context_length", g.U64).put("Q", 2048)),
            ("llama.rope.freq_base", lambda g: g.key("llama.rope.freq_base", g.F32).put("f", 10000.0))]
    if with_tokenizer:
        meta += [("m", lambda g: g.key("tokenizer.ggml.model", g.STR).str("gpt2")),
                 ("t", lambda g: g.strings("tokenizer.ggml.tokens", vocab)),
                 ("y", lambda g: g.ints("tokenizer.ggml.token_type", types)),
                 ("r", lambda g: g.strings("tokenizer.ggml.merges", merges)),
                 ("e", lambda g: g.key("tokenizer.ggml.eos_token_id", g.U32).put("I", len(vocab) - 2)),
                 ("c", lambda g: g.key("tokenizer.chat_template", g.STR).str(
                     "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                     "{% endfor %}You are a helpful AI assistant"))]
    g = Gguf().raw(b"GGUF").put("I", version).put("Q", len(tensors)).put("Q", len(meta))
    for _, write_kv in meta:
        write_kv(g)
    offset = 0
    for name, dims, ttype, data in tensors:
        g.str(name).put("I", len(dims)).put("%dQ" % len(dims), *dims).put("I", ttype).put("Q", offset)
        offset += (len(data) + 31) // 32 * 32
    g.align(32)
    for _, _, _, data in tensors:  # at the offsets written above: each padded to 32 bytes
        g.raw(data).align(32)
    return g.b


def gguf_seeds():
    write("fuzz_gguf", gguf_file(True, 3))
    write("fuzz_gguf", gguf_file(False, 2))
    write("fuzz_gguf", Gguf().raw(b"GGUF").put("I", 3).put("Q", 0).put("Q", 0).b)


if __name__ == "__main__":
    npy_seeds()
    cli_seeds()
    compress_seeds()
    gguf_seeds()
