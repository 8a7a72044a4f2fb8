import os

import torch

# Triton decides at import time whether kernels run interpreted; without a GPU they must.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
