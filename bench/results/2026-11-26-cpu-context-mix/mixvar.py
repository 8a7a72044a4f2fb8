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


class HybWithMixWork(HybridProposer):
    """The hybrid's chains, sent; the mixture's learning and chain computed beside them and
    dropped: the mixture's host work without its drafts."""

    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        from decoding.context_mix import ContextMix

        impl = self.drafter_impl
        impl.shadow = ContextMix()
        draft, extend = impl.draft, impl._extend

        def shadow_extend(req, row, n, extend=extend):
            m = len(req.tokens)
            extend(req, row, n)  # syncs the trie with the new tokens (the hybrid's way)
            tries = [req.trie, impl.store.trie if impl.store is not None else None]
            for pos in range(max(m, 1), len(req.tokens)):  # learns after the trie holds them: same work
                impl.shadow.learn(tries, req.tokens[max(pos - 8, 0):pos], req.tokens[pos])

        def shadow_draft(req, depth, draft=draft):
            tries = [req.trie, impl.store.trie if impl.store is not None else None]
            impl.shadow.chain(tries, req.tokens, depth, 0.2)
            return draft(req, depth)

        impl._extend, impl.draft = shadow_extend, shadow_draft


LAST = []  # each call's draft lengths, read by steps_by_length.py in the same process


class _Logged:
    def propose(self, *a, **k):
        out = super().propose(*a, **k)
        LAST.append([len(x) for x in out])
        return out


class MixL(_Logged, MixProposer):
    pass


class HybL(_Logged, HybridProposer):
    pass


CURVE = (47.0, 57.0, 47.4, 41.5, 42.0, 47.0, 55.7, 60.0, 60.0, 63.0, 60.0)


class HybCut(HybridProposer):
    """The hybrid, chains cut by the measured step-cost curve (min_chance 0). Needs
    draft_cost.patch (VllmDrafterConfig.draft_cost), which is not in the code."""

    def __init__(self, vllm_config):
        super().__init__(vllm_config, VllmDrafterConfig(drafter="hybrid", min_chance=0.0, draft_cost=CURVE))
