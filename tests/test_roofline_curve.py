"""models.cost.Roofline (a forward's floor from bytes and flops) and its step-cost curve, which
bench/roofline_curve.py writes for ``bench/run.py --emulate-cost``."""

import pytest

from bench.roofline_curve import parse_args
from models.cost import BATCHES, GRID, LONG_GRID, Roofline, load_step_cost, save_step_cost

# round numbers: 1 GB of weights at 50 GB/s = 20 ms; 0.1 GFLOP per row at 100 GFLOP/s = 1 ms a row
ROOF = Roofline(weight_bytes=10**9, row_flops=10**8, attn_flops=10**4, kv_bytes=10**5, peak_gflops=100.0,
                bandwidth_gbs=50.0)


def test_the_floor_is_the_larger_of_bytes_and_flops():
    # one token over 1,000 keys: memory-bound, the weights and the keys and values once
    assert ROOF.forward_ms([1], [999]) == pytest.approx((10**9 + 10**5 * 1000) / 50e6)
    # 64 tokens: compute-bound, every row's products and attention over context + step
    assert ROOF.forward_ms([64], [256]) == pytest.approx((64 * 10**8 + 10**4 * 64 * 320) / 100e6)
    # a batch: the weights once, each sequence's own keys
    two = ROOF.forward_ms([1, 1], [99, 99])
    assert two == pytest.approx((10**9 + 2 * 10**5 * 100) / 50e6)


def test_the_curve_is_the_floor_times_the_scale_on_the_measured_grid():
    floor, slow = ROOF.step_cost(1.0, 256, 1024), ROOF.step_cost(2.5, 256, 1024)
    assert floor.tokens == list(GRID) and floor.long_tokens == list(LONG_GRID)
    assert slow.ms == pytest.approx([2.5 * m for m in floor.ms])
    assert slow.long_ms == pytest.approx([2.5 * m for m in floor.long_ms])
    assert floor.ms[0] == pytest.approx(ROOF.forward_ms([1], [256]))
    assert floor.ms == sorted(floor.ms)  # a wider step never costs less
    # batches of one-token steps are memory-bound here: a sequence more adds its context's keys
    # and values (its step token's are in the curve's point already)
    assert max(BATCHES) <= 16
    assert floor.per_seq_ms == pytest.approx(10**5 * 256 / 50e6, rel=1e-6)
    # the planner's prediction at a longer context grows by the keys read
    assert floor([1], [1024]) == pytest.approx(ROOF.forward_ms([1], [1024]), rel=1e-6)


def test_the_curve_round_trips_through_a_step_cost_file(tmp_path):
    cost = ROOF.step_cost(2.0)
    save_step_cost(cost, tmp_path / "roof.json")
    back = load_step_cost(tmp_path / "roof.json")
    assert back.ms == pytest.approx(cost.ms) and back.per_seq_ms == pytest.approx(cost.per_seq_ms)


def test_bad_numbers_are_named():
    with pytest.raises(ValueError, match="bandwidth_gbs must be a finite number > 0"):
        Roofline(10**9, 10**8, 10**4, 10**5, 100.0, 0.0)
    with pytest.raises(ValueError, match="weight_bytes"):
        Roofline(-1, 10**8, 10**4, 10**5, 100.0, 50.0)
    with pytest.raises(ValueError, match="scale must be"):
        ROOF.step_cost(0.0)
    with pytest.raises(ValueError, match="context < long_context"):
        ROOF.step_cost(1.0, 1024, 256)


def test_cli_refuses_bad_arguments_by_name(tmp_path, capsys):
    for argv, name in ((["--margin", "0.5"], "--margin"), (["--scale", "-1"], "--scale"),
                       (["--bandwidth", "0"], "--bandwidth"), (["--peak", "nan"], "--peak"),
                       (["--out", str(tmp_path)], "--out")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert name in capsys.readouterr().err
