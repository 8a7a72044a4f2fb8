"""quant_gemm.c with a timestamp per thread where it enters linear_topk's region and where it ends
its tiles, and where the region is over (harness.c reads them): python3 make_qg.py IN OUT"""

import sys

src = open(sys.argv[1]).read()
edits = [
    (
        '#include "side_prefetch.h"',
        '#include "side_prefetch.h"\n#include <time.h>\nstatic inline double tnow(void) '
        "{struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;}\n"
        "double qt_stamp[4][4]; double qt_call0;",
    ),
    (
        "#pragma omp parallel num_threads(nt)\n    {\n#pragma omp for schedule(static)",
        "qt_call0 = tnow();\n#pragma omp parallel num_threads(nt)\n    {\n"
        "        qt_stamp[omp_get_thread_num()][0] = tnow();\n"
        "#pragma omp for schedule(static)",
    ),
    (
        "        if (k > 0) { /* this thread's columns of every row",
        "        qt_stamp[t][1] = tnow();\n        if (k > 0) { /* this thread's columns of every row",
    ),
    (
        "    int64_t n_bad = 0;\n    if (k > 0) {",
        "    qt_stamp[0][2] = tnow();\n    int64_t n_bad = 0;\n    if (k > 0) {",
    ),
]
for old, new in edits:
    assert old in src, old
    src = src.replace(old, new, 1)
open(sys.argv[2], "w").write(src)
