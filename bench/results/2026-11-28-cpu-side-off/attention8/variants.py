"""Writes variants of kernels/cpu/skinny_attention.c (argv[1]) into the current folder, to see
where an 8-row step's attention spends its time (run.sh builds and times them):
  v12     QBMAX 12 in the AVX-512 build (12 queries a group where a task has 12 or more, else 6 or
          3): the same numbers, each key chunk converted once for 12 queries instead of 6;
  noqk    no scores (qk_4p not called): diagnostic, wrong numbers;
  nosm    no softmax (each query's block skipped): diagnostic;
  pvonly  no scores, no softmax (numerators zeroed): the weighted sums and the rest;
  none    no scores, softmax or weighted sums (zeros written): what is left is the tasks' setup,
          prefetches, visibility, the merge, the threads."""
import sys

s = open(sys.argv[1]).read()


def sub(text, old, new):
    assert old in text, old
    return text.replace(old, new)


v = sub(s, "#define QBMAX 6", "#define QBMAX 12").replace('_Pragma("GCC unroll 6")', '_Pragma("GCC unroll 12")')
v = sub(v, "QB = NQ >= QBMAX ? QBMAX : 3;", "QB = NQ >= QBMAX ? QBMAX : NQ >= 6 ? 6 : 3;")
v = sub(v, "            else qk_4p(s1, c, qp, kp + c, D, half, 3);",
        "            else if (QB == 6) qk_4p(s1, c, qp, kp + c, D, half, 6);\n"
        "            else qk_4p(s1, c, qp, kp + c, D, half, 3);")
v = sub(v, "            else PV_4(sp, p, vp, nb * 8, d0, half, 3);",
        "            else if (QB == 6) PV_4(sp, p, vp, nb * 8, d0, half, 6);\n"
        "            else PV_4(sp, p, vp, nb * 8, d0, half, 3);")
open("v12.c", "w").write(v)
noqk = sub(s, "if (QB == QBMAX) qk_4p(s1, c, qp, kp + c, D, half, QBMAX);",
           "if (0) qk_4p(s1, c, qp, kp + c, D, half, QBMAX);")
noqk = sub(noqk, "            else qk_4p(s1, c, qp, kp + c, D, half, 3);",
           "            else if (0) qk_4p(s1, c, qp, kp + c, D, half, 3);")
open("noqk.c", "w").write(noqk)
skip = ("            live[i] = vis_any;\n            if (!live[i]) {",
        "            live[i] = vis_any;\n            if (1) { outp[i][0] = 0; outp[i][1] = 1;"
        " memset(sc[i], 0, sizeof(float) * SPLIT); continue; }\n            if (!live[i]) {")
open("nosm.c", "w").write(sub(s, *skip))
pvonly = sub(noqk, *skip)
open("pvonly.c", "w").write(pvonly)
none = sub(pvonly, "        for (; d0 + 32 <= D; d0 += 32)\n", "        for (; 0 && d0 + 32 <= D; d0 += 32)\n")
none = sub(none, "        for (; d0 < D; d0 += 8)\n", "        for (d0 = D; d0 < D; d0 += 8)\n")
none = sub(none, "for (int i = 0; i < nq; i++) memcpy(outp[i] + 2, sums[i], sizeof(float) * (size_t)D);",
           "for (int i = 0; i < nq; i++) memset(outp[i] + 2, 0, sizeof(float) * (size_t)D);")
open("none.c", "w").write(none)
