import time, torch, sys
sys.path.insert(0, '/work/main')
torch.set_num_threads(2)
from models.loader import load_model
from decoding.generate import generate
m = load_model("smollm2").model
g = torch.Generator().manual_seed(0)
chunks = [int(c) for c in sys.argv[1].split(",")]
for n in [int(x) for x in sys.argv[2].split(",")]:
    prompt = [int(t) for t in torch.randint(100, 40000, (n,), generator=g)]
    best = {}
    outs = {}
    for r in range(4):
        for c in (chunks if r % 2 == 0 else chunks[::-1]):
            t = time.perf_counter()
            res = generate(m, [prompt], max_new_tokens=1, prefill_chunk=c)
            best[c] = min(best.get(c, 1e9), time.perf_counter() - t)
            outs[c] = res[0].tokens if hasattr(res[0], 'tokens') else res[0]
    print(n, " ".join(f"{c}:{best[c]:.3f}s" for c in chunks), "same first token:", len({str(o) for o in outs.values()}) == 1, flush=True)
