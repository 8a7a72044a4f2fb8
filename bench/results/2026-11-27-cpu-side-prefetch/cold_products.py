import time, torch, sys
sys.path.insert(0, '.')
from kernels import quant, skinny
lib = skinny._require()
torch.manual_seed(0)
layers = 30
junk = torch.empty(64 * 1024 * 1024 // 4)
def run(N, K, M=1, fmt='q4_1', reps=15):
    ws = [quant.quantize_q4_1(torch.randn(N, K)) if fmt == 'q4_1' else quant.quantize_q8_0(torch.randn(N, K)) for _ in range(layers)]
    x = torch.randn(M, K)
    res = []
    for r in range(reps):
        tot = 0
        for l in range(layers):
            if l % 10 == 0: junk[::16].add_(1.0)
            t0 = time.perf_counter()
            quant.linear_unchecked(lib, x, ws[l], None, 2)
            tot += time.perf_counter() - t0
        res.append(tot)
    res.sort(); ms = res[len(res)//2] * 1e3
    mb = layers * ws[0].data.numel() / 1e6
    return ms, mb
for N, K in [(3072, 576), (576, 1536), (960, 576), (576, 576)]:
    for M in (1, 8):
        ms, mb = run(N, K, M)
        print(N, K, M, '%.3f ms %.1f MB %.1f GB/s  per call %.1f us' % (ms, mb, mb / ms, ms * 1000 / layers))
