"""The on-disk caches under concurrency: two processes that build the CPU kernels
(``SPECDEC_KERNEL_CACHE``), tune a model's products (``cache_dir/tune``) and measure its step
cost (``cache_dir/cost``) at the same time, from an empty folder, both succeed and neither
reads a half-written file; a third process then reads every cache back without measuring.
Every writer goes through a temporary file and a rename (kernels/cbuild.py's ``build``,
models/machine.py's ``write_whole``); the quick tests here pin that down without a race."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from models import machine
from models.cost import StepCost, load_step_cost, save_step_cost, step_cost

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------ the writes, one by one

def test_write_whole_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "cache.json"
    machine.write_whole(path, "first")
    machine.write_whole(path, "second")
    assert path.read_text() == "second" and os.listdir(path.parent) == ["cache.json"]


def test_a_write_that_fails_keeps_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    machine.write_whole(path, '{"old": 1}')

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(machine.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        machine.write_whole(path, '{"new": 2}')
    assert json.loads(path.read_text()) == {"old": 1} and os.listdir(tmp_path) == ["cache.json"]


def _watch_renames(monkeypatch) -> list:
    """Every rename write_whole makes, as (the final path existed before, the text renamed in)."""
    seen, real = [], os.replace

    def spy(src, dst):
        seen.append((Path(dst), Path(dst).exists(), Path(src).read_text()))
        real(src, dst)

    monkeypatch.setattr(machine.os, "replace", spy)
    return seen


def test_the_tuning_and_step_cost_caches_appear_whole(tmp_path, monkeypatch):
    """tune_model, step_cost and save_step_cost write through write_whole: the cache file
    does not exist until its whole JSON is renamed in (a reader sees nothing or all of it)."""
    from helpers import ours_from_hf, tiny_hf_model
    from models.tune import tune_model

    tiny = ours_from_hf(tiny_hf_model("llama", seed=3)).model
    seen = _watch_renames(monkeypatch)
    tune_model(tiny, tmp_path, "off", timer=lambda fn, reps: (fn(), 1.0)[1], stack_timer=None)
    fake = StepCost(tokens=[1, 4, 16], ms=[10.0, 11.0, 15.0], per_seq_ms=0.5, context=256)
    step_cost(tiny, tmp_path, measure=lambda m, c, r: fake, check=False)
    save_step_cost(fake, tmp_path / "pinned" / "cost.json")
    assert [(p.parent.name, existed) for p, existed, _ in seen] == [("tune", False), ("cost", False),
                                                                     ("pinned", False)]
    for path, _, text in seen:
        assert json.loads(text) and path.read_text() == text
    assert load_step_cost(tmp_path / "pinned" / "cost.json").ms == fake.ms
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------ the race, for real

# One worker: imports first, then waits for the go file, so that both build, tune and measure
# at the same time. A cache file read half-written would warn "unreadable" (or, for a kernel
# library, fail to load): warnings are errors here.
WORKER = textwrap.dedent("""
    import json, os, sys, time, warnings
    from pathlib import Path
    warnings.filterwarnings("error", message=".*(unreadable|another setup|no longer matches).*")
    import torch
    from helpers import tiny_hf_model
    from kernels import skinny
    from models import packing
    from models.cost import step_cost
    from models.loader import from_hf

    folder, me = Path(sys.argv[1]), sys.argv[2]
    (folder / f"ready-{me}").touch()
    while not (folder / "go").exists():
        time.sleep(0.01)
    t0 = time.time()
    skinny_built = skinny.available()
    packing_built = packing.LIBRARY.get() is not None
    model = from_hf(tiny_hf_model("llama", seed=5), tune=True, cache_dir=folder / "cache").model
    cost = step_cost(model, folder / "cache", context=64, reps=1, check=False)
    print(json.dumps(dict(skinny=skinny_built, packing=packing_built, ms=cost.ms, origin=cost.origin,
                          seconds=time.time() - t0)))
""")

# The reader: the same model again must take everything from the caches (measuring fails).
READER = textwrap.dedent("""
    import json, sys, warnings
    from pathlib import Path
    warnings.filterwarnings("error", message=".*(unreadable|another setup|no longer matches).*")
    import models.cost, models.tune
    from helpers import tiny_hf_model
    from models.cost import step_cost
    from models.loader import from_hf

    folder = Path(sys.argv[1])
    def no(*a, **k):
        raise AssertionError("measured again: the cache was not read")
    models.tune._measure = no
    models.tune._prefer_whole_stack = lambda *a, **k: None  # no re-timing of the cached table: take it as read
    model = from_hf(tiny_hf_model("llama", seed=5), tune=True, cache_dir=folder / "cache").model
    cost = step_cost(model, folder / "cache", context=64, reps=1, measure=no, check=False)
    print(json.dumps(dict(ms=cost.ms, origin=cost.origin)))
""")


def _env(folder: Path) -> dict:
    return {**os.environ, "SPECDEC_KERNEL_CACHE": str(folder / "kernels"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def test_two_processes_build_tune_and_measure_into_one_empty_folder(tmp_path):
    env = _env(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), str(i)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    try:
        deadline = time.time() + 120
        while not all((tmp_path / f"ready-{i}").exists() for i in (0, 1)):
            assert time.time() < deadline and all(p.poll() is None for p in procs), \
                [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.05)
        (tmp_path / "go").touch()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "unreadable" not in err and "Traceback" not in err, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert all(r["origin"] == "measured" or r["origin"].startswith("cache") for r in results)

    # every cache file parses; no temporary file is left over
    tune, cost = list((tmp_path / "cache" / "tune").glob("*.json")), list((tmp_path / "cache" / "cost").glob("*.json"))
    # one tuning table (the last writer's); a step-cost curve per distinct table (its key holds the
    # products' forms, and two processes tuning on shared cores may choose differently)
    assert len(tune) == 1 and len(cost) in (1, 2)
    for f in tune + cost:
        data = json.loads(f.read_text())
        assert set(data) == {"key", "tables"} or set(data) == {"key", "cost"}
    everything = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not [p for p in everything if p.name.endswith(".tmp")], everything
    libs = list((tmp_path / "kernels").glob("*.so"))
    if results[0]["skinny"] or results[0]["packing"]:
        assert libs, everything

    # a third process reads the caches back (tuning and step cost not measured again)
    r = subprocess.run([sys.executable, "-c", READER, str(tmp_path)], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    back = json.loads(r.stdout.strip().splitlines()[-1])
    assert back["origin"] == "cache (not checked)"
    assert back["ms"] in [json.loads(f.read_text())["cost"]["ms"] for f in cost]
