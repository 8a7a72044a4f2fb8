"""Writes the decoding attention (kernels/cpu/skinny_attention.c) with switches that drop one part
each, for parts.sh: NO_QK (the scores' products: zeros stored where they go), NO_PV (the weighted
sums of the values: zeros), NO_SM (the softmax: every numerator 0, max 0, sum 1), NO_MERGE (the
merge of the splits), NO_PF (the later task's keys requested ahead). The parts left run as in the
kernel, on numbers that are finite (garbage left in the buffers made denormals and slowed the
rest: a first try of these switches did). Usage: python variants.py SRC OUT."""
import sys

src, out = sys.argv[1], sys.argv[2]
s = open(src).read()


def swap(old: str, new: str) -> None:
    global s
    assert s.count(old) == 1, old
    s = s.replace(old, new)


qk = ("            if (QB == QBMAX) qk_4p(s1, c, qp, kp + c, D, half, QBMAX); /* QB a constant in each call */\n"
      "            else qk_4p(s1, c, qp, kp + c, D, half, 3);\n")
swap(qk, "#ifndef NO_QK\n" + qk + "#else\n"
     "            for (int i = 0; i < QB; i++) _mm512_storeu_ps(s1[i] + 4 * c, _mm512_setzero_ps());\n#endif\n")
pv = ("            if (QB == QBMAX) PV_4(sp, p, vp, nb * 8, d0, half, QBMAX);\n"
      "            else PV_4(sp, p, vp, nb * 8, d0, half, 3);\n")
swap(pv, "#ifndef NO_PV\n" + pv + "#else\n"
     "            for (int i = 0; i < QB; i++) for (int c = 0; c < 2; c++) _mm512_storeu_ps(sp[i] + d0 + 16 * c, "
     "_mm512_setzero_ps());\n#endif\n")
sm = "        for (int i = 0; i < QB; i++) {\n            const int t = k->t0 + (q0 + (i < nq ? i : 0)) / G;"
swap(sm, "#ifdef NO_SM\n        for (int i = 0; i < QB; i++) { live[i] = 1; memset(sc[i], 0, sizeof(float) * SPLIT); "
     "outp[i][0] = 0; outp[i][1] = 1; }\n        if (0)\n#endif\n" + sm)
pf = "                prefetch_keys(a, next, pa, pb < next->n ? pb : next->n);"
swap(pf, "#ifndef NO_PF\n" + pf + "\n#endif")
mg = "#pragma omp for schedule(static)\n        for (int64_t r = 0; r < (int64_t)T * H; r++) {"
swap(mg, "#ifdef NO_MERGE\n        if (0)\n#endif\n" + mg)
open(out, "w").write(s)
