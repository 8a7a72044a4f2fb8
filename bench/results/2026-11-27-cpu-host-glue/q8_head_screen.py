"""Could a 4-bit screen of the default model's Q8_0 LM head find the greedy top-k exactly, as the
bf16 screen does for an fp32 head (kernels/cpu/skinny_gemm.c)? Each 32-weight block of the head
re-quantized to symmetric 4 bits (fp16 scale), the screen's logits of 900 real hidden rows (the
last 300 prefill rows of three prompts + answers), and the rigorous per-block bound
sum_b s_x,b sum_i |q_x,i| max_i |w - w4|: how many tokens the bound cannot rule out.
Needs /tmp/host_step_answers.json (bench/host_step.py --answers writes it). Output: q8_head_screen.txt."""
import sys
import json
import torch
sys.path.insert(0, '.')
from models.loader import load_model
from models.runner import ModelRunner, StepInput
from kernels import quant
loaded = load_model("smollm2")
model = loaded.model
saved = json.load(open('/tmp/host_step_answers.json'))
ans = saved['answers']
hq = model.head_quant
W = hq.dequantize().double()  # (N, K) = d * q exactly
N, K = W.shape
print("head", hq.format, N, K)
# hidden rows of real text: the answers (prompt + greedy output) of two prompts, prefill rows
rows = []
for seq in ans[:3]:
    runner = ModelRunner(model, cache_tokens=4096)
    runner.add_sequence(0)
    toks = seq[:1024]
    tokens, meta, idx = runner.prepare([StepInput(0, toks)])
    h = runner.forward(tokens, meta, idx, hidden=True)
    rows.append(h[-300:].contiguous())
h = torch.cat(rows)
q, s = quant.quantize_rows_ref(h)
xq = (q.double().view(-1, K // 32, 32) * s.double()[:, :, None]).view(-1, K)
z = xq @ W.T
# a symmetric 4-bit screen of each 32-block of W
Wb = W.view(N, K // 32, 32)
amax = Wb.abs().amax(2)
d4 = (amax / 7).float().half().double()  # fp16 scale
inv = torch.where(d4 > 0, 1 / d4, torch.zeros_like(d4))
q4 = torch.round(Wb * inv[:, :, None]).clamp(-8, 7)
W4 = q4 * d4[:, :, None]
E = (Wb - W4).abs().amax(2)  # (N, K/32) per block max error
zs = xq @ W4.view(N, K).T
A = (q.double().abs().view(-1, K // 32, 32).sum(2) * s.double())  # (M, K/32) sum |x| per block
B = A @ E.T  # (M, N) bound
err = (z - zs).abs()
print("bound holds:", bool((err <= B + 1e-9).all()), "mean bound", float(B.mean()), "mean |err|", float(err.mean()))
for k in (1, 8):
    lo = (zs - B).topk(k, dim=1).values[:, -1:]
    cand = ((zs + B) >= lo).sum(1).double()
    print(f"k={k}: candidates median {cand.median():.0f} mean {cand.mean():.1f} p90 {cand.quantile(0.9):.0f} "
          f"max {cand.max():.0f}")
top2 = z.topk(2, dim=1).values
print("top1-top2 gap median", float((top2[:, 0] - top2[:, 1]).median()))
