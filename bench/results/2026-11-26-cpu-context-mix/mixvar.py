"""Drafter variants for ab_vllm2.py (vLLM builds them by class path, so each setting is a class)."""
import atexit
import json
import os
import time

from decoding.vllm import HybridProposer, MixProposer, VllmDrafterConfig


class Mix03(MixProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config, VllmDrafterConfig(drafter="mix", min_chance=0.3))


class Mix04(MixProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config, VllmDrafterConfig(drafter="mix", min_chance=0.4))


class Hyb0(HybridProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config, VllmDrafterConfig(drafter="hybrid", min_chance=0.0))



class _Timed:
    def propose(self, *a, **k):
        t = time.perf_counter()
        out = super().propose(*a, **k)
        self._t = getattr(self, '_t', 0.0) + time.perf_counter() - t
        self._n = getattr(self, '_n', 0) + 1
        if not getattr(self, '_reg', False):
            self._reg = True
            atexit.register(lambda: json.dump({'cls': type(self).__name__, 'calls': self._n, 's': self._t,
                                               'stats': self.stats},
                                              open(f'/tmp/timing_{type(self).__name__}_{os.getpid()}.json', 'w')))
        return out


class MixT(_Timed, MixProposer):
    pass


class HybT(_Timed, HybridProposer):
    pass


class Hyb01(HybridProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config, VllmDrafterConfig(drafter="hybrid", min_chance=0.1))


class Hyb005(HybridProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config, VllmDrafterConfig(drafter="hybrid", min_chance=0.05))
