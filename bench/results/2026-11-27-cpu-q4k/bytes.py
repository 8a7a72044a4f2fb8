"""The 1.5B's product bytes a one-token step reads on the native path, before (every product Q8_0
from fp32) and now (a fused product whose parts are all Q4_K read as q4_1f, the rest Q8_0): from
the GGUF file's tensor types, with the loader's fusing (q / k / v, gate / up) and the kernel's
bytes per 32-weight block (q4_1f 24, q8_0 34), padding rows to panels of 16 ignored."""
import sys
from collections import defaultdict
from pathlib import Path

import gguf

path = Path(sys.argv[1] if len(sys.argv) > 1 else Path.home() / ".cache/specdec/models/qwen2.5-coder-1.5b.gguf")
reader = gguf.GGUFReader(str(path))
types = {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in reader.tensors}
groups = defaultdict(list)  # fused product -> its parts
FUSED = {"attn_q": "qkv", "attn_k": "qkv", "attn_v": "qkv", "ffn_gate": "gate_up", "ffn_up": "gate_up"}
for name, (kind, shape) in types.items():
    if len(shape) != 2 or name == "token_embd.weight" and "output.weight" in types:
        continue
    base = name.rsplit(".", 2)
    part = base[-2] if len(base) == 3 else name
    key = FUSED.get(part, part)
    groups[(base[0] + "." + base[1] if len(base) == 3 else "head", key)].append((kind, shape))
before = now = 0
kinds = defaultdict(int)
for (_, key), parts in groups.items():
    weights = sum(s[0] * s[1] for _, s in parts)
    before += weights // 32 * 34
    native = all(k == "Q4_K" for k, _ in parts)
    now += weights // 32 * (24 if native else 34)
    kinds["q4_1f" if native else "q8_0"] += weights
print(f"{path.name}: products {sum(kinds.values()) / 1e6:.0f} M weights: " +
      ", ".join(f"{k} {v / 1e6:.0f} M" for k, v in kinds.items()))
print(f"bytes a one-token step reads of them: before {before / 1e6:.0f} MB, now {now / 1e6:.0f} MB "
      f"({now / before:.2f}x)")
