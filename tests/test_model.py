"""The performance model (ringreduce.model): structure checks, hand-computed NCCL costs,
the bench-JSON reader and the calibration CLI. Its validation against the committed
results (benchmarks/model_validation/) is tests/test_model_validation.py's."""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path

import pytest

from ringreduce.config import Config
from ringreduce.model import PRESETS, Cluster, calibrate, cli, nccl_cost, probe, results, simulate
from ringreduce.model.nccl_cost import link_bound_us, nccl_time_us, ring_time_us, tree_time_us
from ringreduce.model.simulate import Options, ringreduce_time_us
from ringreduce.plan import layout, schedule, slicing

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def hand_cluster(machines: int, gpus: int) -> Cluster:
    # 800 Gbit/s = 100,000 bytes/us intra; 400 Gbit/s = 50,000 bytes/us per machine
    return Cluster("hand", machines, gpus, intra_gbps=800, intra_lat_us=3.4,
                   net_gbps=400, net_lat_us=14.0)


def wire_only(machines: int, gpus: int) -> Cluster:
    """Only the network costs anything: no host cost, latency, NVLink or memory limit."""
    return Cluster("wire", machines, gpus, intra_gbps=1e9, intra_lat_us=0.0, net_gbps=400,
                   net_lat_us=0.0, mem_gbps=1e9, host_call_us=0.0, host_slice_us=0.0,
                   host_peer_us=0.0, peer_us=0.0)


def test_link_bound_is_2s_m_minus_1_over_m_b() -> None:
    size = 10**8
    for m in (2, 4, 64):
        want = 2 * size * (m - 1) / (m * 50_000)
        assert link_bound_us(size, hand_cluster(m, 8)) == pytest.approx(want, rel=1e-12)
    assert link_bound_us(size, hand_cluster(1, 8)) == 0


def test_ring_time_is_nccls_formula_by_hand() -> None:
    # N = 4, 2 nodes: latency (8.4 + (6 - 2) * 3.4 + 2 * 14) * 1.4 = 70.0 us; busBw =
    # min(100,000, 50,000) bytes/us moves 2S(N-1)/N = 1.5e8 bytes in 3000 us.
    assert ring_time_us(10**8, hand_cluster(2, 2)) == pytest.approx(3070.0, rel=1e-12)


def test_tree_time_is_nccls_formula_by_hand() -> None:
    # latency 8.4 + 2 * ((2 - 1) * 3.4 + log2(4) * 14) = 71.2 us; 4 nodes move 2S per
    # machine: 4000 us at 50,000 bytes/us, over 0.92; the tuner's estimate also over the
    # correction 0.8 for log2(1e8 / 64) = 20. Two nodes move S per machine: the link bound.
    assert tree_time_us(10**8, hand_cluster(4, 2)) == pytest.approx(71.2 + 4000 / 0.92,
                                                                    rel=1e-12)
    want = 71.2 + 4000 / (0.92 * 0.8)
    assert nccl_cost.tree_estimate_us(10**8, hand_cluster(4, 2)) == pytest.approx(want, rel=1e-12)
    two = hand_cluster(2, 2)
    assert tree_time_us(10**8, two) == pytest.approx(
        8.4 + 2 * (3.4 + 14) + link_bound_us(10**8, two) / 0.92, rel=1e-12)


def test_nccl_default_is_the_tuners_pick_and_best_the_faster() -> None:
    big = hand_cluster(1024, 8)  # a ring's latency grows with N, a tree's with log N
    assert tree_time_us(MiB, big) < ring_time_us(MiB, big)
    assert nccl_cost.nccl_algo(MiB, big) == "tree"
    assert nccl_time_us(MiB, big) == tree_time_us(MiB, big)


@pytest.mark.parametrize(("m", "d"), [(2, 8), (4, 8), (8, 4), (16, 2)])
def test_speedup_over_ring_tends_to_the_bytes_ceiling(m: int, d: int) -> None:
    n, size = m * d, 4 << 30
    ceiling = (2 * (n - 1) / n) / (2 * (m - 1) / m)
    c = wire_only(m, d)
    speedup = ring_time_us(size, c) / ringreduce_time_us(size, c, Options())
    assert speedup == pytest.approx(ceiling, rel=0.03)
    assert ringreduce_time_us(size, c, Options()) >= link_bound_us(size, c)


def test_ceiling_figures_of_the_issue() -> None:
    """Issue 17: about 1.9x at 2 machines of 8 GPUs, 1.3x at 4, 1.1x at 8."""
    got = [(2 * (8 * m - 1) / (8 * m)) / (2 * (m - 1) / m) for m in (2, 4, 8)]
    assert [round(g, 1) for g in got] == [1.9, 1.3, 1.1]


def test_more_slices_help_until_host_cost_dominates() -> None:
    c = PRESETS["eth-100g"].with_(machines=4)
    t = {sb: ringreduce_time_us(256 * MiB, c, Options(slice_bytes=sb))
         for sb in (256 * MiB, 32 * MiB, 8 * MiB, 128 << 10)}
    assert t[32 * MiB] < t[256 * MiB]  # pipelining: stages of slices overlap
    assert t[128 << 10] > 2 * t[8 * MiB]  # 2048 slices x 100 us of host time


def test_buckets_overlap_but_not_past_the_link() -> None:
    c = PRESETS["eth-100g"].with_(machines=4)
    one = ringreduce_time_us(25 * MiB, c, Options())
    four = ringreduce_time_us(25 * MiB, c, Options(), buckets=4)
    assert 4 * link_bound_us(25 * MiB, c) <= four < 4 * one


def test_a_16_bit_wire_halves_a_network_bound_call() -> None:
    c = PRESETS["eth-100g"].with_(machines=4)
    fp32 = ringreduce_time_us(256 * MiB, c, Options())
    wire = ringreduce_time_us(256 * MiB, c, Options(wire_factor=0.5))
    assert 0.45 < wire / fp32 < 0.6
    assert ringreduce_time_us(256 * MiB, c, Options(wire_factor=0.5)) < \
        link_bound_us(256 * MiB, c)  # below the fp32 bound: fewer bytes cross


ONE = Options(plan="one-slice")


def test_one_slice_call_is_three_collectives_by_hand() -> None:
    # reduce-scatter and all-gather over D = 2 on NVLink: 3.4 us + S/2 at 100,000 bytes/us
    # = 503.4 us each. The rail: 2 ranks on 2 hosts, S/D = 5e7 bytes each on 200 Gbit/s
    # (the machine's 400 over its 2 rails) = 25,000 bytes/us. NCCL's ring: latency
    # (8.4 + 2 * 14) * 1.4 = 50.96 us, 2 * 5e7 * 1/2 bytes in 2000 us; its tree's estimate,
    # 36.4 + 2000 / (0.92 * 0.7), is slower, so the tuner takes the ring.
    c = hand_cluster(2, 2)
    want = 2 * 503.4 + 50.96 + 2000.0
    assert simulate.one_slice_call_us(10**8, c, ONE) == pytest.approx(want, rel=1e-12)
    rail = simulate.rail_cluster(c)
    assert (rail.machines, rail.gpus, rail.net_gbps) == (2, 1, 200)
    assert nccl_cost.nccl_algo(5 * 10**7, rail) == "ring"


def test_one_slice_calls_follow_one_another_on_the_device() -> None:
    c = wire_only(4, 2)
    size = 10**8
    # no host cost: 16 calls end to end, each at the link bound (and NCCL's 11.8 us)
    sixteen = simulate.one_slice_time_us(size, c, ONE, 16, 3)
    assert sixteen == pytest.approx(16 * link_bound_us(size, c), rel=0.01)
    call = simulate.one_slice_call_us(size, c, ONE)
    # a host slower than the device sets the pace: a call per host_call_us
    slow = c.with_(host_call_us=10 * call, host_slice_us=0.0)
    assert simulate.one_slice_time_us(size, slow, ONE, 4, 1) == pytest.approx(40 * call + call)
    # a fast host only delays the first call; over iterations that is amortised
    fast = c.with_(host_call_us=100.0, host_slice_us=0.0)
    assert simulate.one_slice_time_us(size, fast, ONE, 4, 2) == pytest.approx(4 * call + 50)
    # the plan picks the pricing, in both entry points
    assert simulate.steady_time_us(size, fast, ONE, 4, 2) == \
        simulate.one_slice_time_us(size, fast, ONE, 4, 2)
    assert ringreduce_time_us(size, fast, ONE, 4) == \
        simulate.one_slice_time_us(size, fast, ONE, 4, 1)


def test_one_slice_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"plan=.one-slice. with wire_factor=0\.5"):
        Options(plan="one-slice", wire_factor=0.5)
    with pytest.raises(ValueError, match="plan='sliced' is not one of"):
        Options(plan="sliced")


#: PCIe-only machines: 4 GPUs at PCIe 4.0 x16 (~25 GB/s, 200 Gbit/s) each way, 200 Gbit/s
#: a machine. The intra-machine stages take as long as the rail's: the pipeline overlaps them.
PCIE = Cluster("pcie", 2, 4, intra_gbps=200, intra_lat_us=10.0, net_gbps=200, net_lat_us=14.0)
#: The faithful runs' nominal cluster (benchmarks/model_validation/faithful.py): 2 x 2 on
#: NVLink, 10 Gbit/s a machine; the engine took one slice in every process there.
FAITHFUL = PRESETS["dgx-h100"].with_(name="faithful", gpus=2, intra_gbps=1200, net_gbps=10)


@pytest.mark.parametrize(("c", "want"), [(PCIE, "pipelined"), (FAITHFUL, "one-slice")])
def test_auto_takes_the_plan_slicing_choose_would(c: Cluster, want: str) -> None:
    nbytes = slicing.PROBE_BYTES
    one, piped = (probe.probe_us(c, Options(plan=p), nbytes)
                  for p in (slicing.ONE_SLICE, slicing.PIPELINED))
    planned = probe.engine_plan(c, Options())
    timing = slicing.Timing(nbytes, {slicing.ONE_SLICE: (one / 1e6,),
                                     slicing.PIPELINED: (piped / 1e6,)})
    assert planned.plan == slicing.choose([timing], probe.MODEL_MARGIN).plan == want
    assert planned.brief == f"{one / 1e3:.2f}/{piped / 1e3:.2f}"
    assert planned.probed and planned.choice.reason.startswith("predicted: probe at 16 MiB")
    # the rows are priced on it, as Options(plan=...) prices them
    assert planned.options(Options()) == Options(plan=want)


def test_the_probe_is_timed_after_its_warm_up() -> None:
    c = wire_only(4, 2)
    # no host cost: the device's time per call
    call = simulate.one_slice_call_us(16 * MiB, c, ONE)
    assert probe.probe_us(c, ONE, 16 * MiB) == pytest.approx(call, rel=1e-9)
    # a host slower than the device: a call per host_call_us + host_slice_us
    slow = c.with_(host_call_us=10 * call, host_slice_us=call)
    assert probe.probe_us(slow, ONE, 16 * MiB) == pytest.approx(11 * call, rel=1e-9)


def test_plans_decided_without_a_probe() -> None:
    c = PCIE
    assert probe.engine_plan(c.with_(machines=1), Options()).choice is slicing.ONE_MACHINE
    assert probe.engine_plan(c.with_(gpus=1), Options()).choice is slicing.ONE_DEVICE
    given = probe.engine_plan(c, Options(), "one-slice")
    assert (given.plan, given.brief, given.probed) == ("one-slice", "--plan", False)
    wire = probe.engine_plan(c, Options(wire_factor=0.5), "one-slice")
    assert wire.choice is probe.WIRE and wire.options(Options(wire_factor=0.5)).plan == \
        "pipelined"
    big = probe.engine_plan(c, Options(min_bytes=512 * MiB))
    assert big.plan == "pipelined" and "above the probe's largest call" in big.choice.reason
    with pytest.raises(ValueError, match="plan='sliced' is not one of"):
        probe.engine_plan(c, Options(), "sliced")


def test_cli_prices_the_plan_the_engine_would_take(capsys: pytest.CaptureFixture[str]
                                                  ) -> None:
    flags = ["--machines", "2", "--gpus-per-machine", "4", "--intra-gbps", "200",
             "--machine-net-gbps", "200", "--intra-latency-us", "10", "--sizes", "25M"]
    (auto,) = cli.main(flags)
    out = capsys.readouterr().out
    c = cli.cluster_from(cli.build_parser().parse_args(flags))
    assert auto["plan"] == probe.engine_plan(c, Options()).plan == "pipelined"
    assert f"the faster, one slice within {probe.MODEL_MARGIN:.0%}" in out
    assert out.splitlines()[-1].split()[-2:] == ["pipelined", auto["why"]]
    for plan in slicing.PLANS:
        (row,) = cli.main([*flags, "--plan", plan])
        assert row["plan"] == plan and row["why"] == "--plan"
        assert row["rr"] == ringreduce_time_us(25 * MiB, c, Options(plan=plan))
    (dgx,) = cli.main(["--machines", "2", "--sizes", "25M"])  # NVLink: one slice
    assert dgx["plan"] == "one-slice"
    with pytest.raises(SystemExit):
        cli.main(["--plan", "sliced"])


def test_the_model_runs_the_engines_plan() -> None:
    d, m, size = 4, 2, 100 * MiB + 12  # a tail: the last slice carries padding
    sb = Config().resolved_slice_bytes(d, m)
    slices = layout.plan_slices(size // 4, 4, d, m, sb)
    plan = simulate._plan(size // 4, 4, d, m, sb, 2, 1)
    assert plan.slices == (len(slices),)
    assert len(plan.stage) == len(slices) * len(schedule.STAGES)
    # two staging slots: collect of slice i+2 waits for add of slice i (slot reuse)
    where = {(i, st): k for k, (i, st) in enumerate(zip(plan.slice_index, plan.stage,
                                                        strict=True))}
    assert where[2, "collect"] in plan.after[where[0, "add"]]
    assert where[1, "collect"] not in plan.after[where[0, "add"]]


def test_small_tensors_and_one_machine_take_nccls_route() -> None:
    c = PRESETS["dgx-h100"]
    assert ringreduce_time_us(MiB, c, Options()) == nccl_time_us(MiB, c)
    one = c.with_(machines=1)
    assert ringreduce_time_us(64 * MiB, one, Options()) == nccl_time_us(64 * MiB, one)


def test_model_modules_import_only_stdlib_and_the_pure_plan() -> None:
    pure = {"plan", "layout", "schedule", "slicing", "config", "sizes", "defaults", "cluster",
            "nccl_cost", "simulate", "probe", "results", "calibrate", "plot", "cli"}
    for path in (ROOT / "ringreduce" / "model").glob("*.py"):
        for node in ast.parse(path.read_text()).body:  # module level: what import runs
            if isinstance(node, ast.ImportFrom) and node.level:
                names = [node.module] if node.module else [a.name for a in node.names]
                for name in names:
                    assert name.split(".")[-1] in pure, f"{path.name} imports .{name}"
            elif isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names]
                for name in names:
                    top = (name or "").split(".")[0]
                    assert top in sys.stdlib_module_names or top == "__future__", \
                        f"{path.name} imports {name} at module level"


def test_setting_is_read_from_the_emulators_fidelity_line() -> None:
    """benchmarks/emulate.py's sentence for 2 x 2 on one GPU under MPS, capped."""
    meta = {"world": 4, "devices_per_machine": 2, "options": {"link_gbit": None},
            "fidelity": "emulated 2x2 on one host; intra-machine traffic: loopback sockets "
                        "in the machine's namespace (its ranks share a GPU under MPS); NCCL "
                        "sees 4 hosts; link cap 10gbit each way per machine (tc tbf), burst "
                        "1mb, MTU 9000; GPUs 1, MPS on; CPU cores per rank 4.0"}
    s = results.setting_of("2099-01-01-new-folder", meta)
    assert s == results.Setting(4, True, "sockets", "ranks")
    assert results.cores_per_rank(meta) == 4.0
    assert results.link_gbit_of(meta) == 10.0
    faithful = meta | {"fidelity": "emulated 2x2 on one host; intra-machine traffic: "
                                   "NVLink/PCIe (NCCL P2P); NCCL sees 2 hosts; no link cap "
                                   "(all on lo); GPUs 2, MPS off; CPU cores per rank 4.0"}
    assert results.setting_of("2099-01-01-x", faithful) == results.Setting(2, False, "nvlink",
                                                                            "machines")


def _sample(row: dict[str, object], meta: dict[str, object], tmp: Path) -> results.Sample:
    path = tmp / "2099-01-01-x" / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": [row]}))
    (sample,) = results.load_file(path)
    return sample


def test_exclusion_rules(tmp_path: Path) -> None:
    meta = {"machines": 2, "devices_per_machine": 2, "world": 4,
            "options": {"link_gbit": 10.0, "iters": 10}, "config": {},
            "fidelity": "intra-machine traffic: loopback sockets (under MPS); GPUs 1, MPS "
                        "on; CPU cores per rank 2.0"}
    row = {"size": 16 * MiB, "buckets": 1, "rr_time_us": 10_000.0, "ref_time_us": 12_000.0,
           "rr_cpu_us": 5_000.0, "ref_cpu_us": 5_000.0}
    assert results.exclusion(_sample(row, meta, tmp_path)) is None
    busy = _sample(row | {"rr_cpu_us": 19_000.0}, meta, tmp_path)
    assert "CPU-bound" in (results.exclusion(busy) or "")
    replay = _sample(row, meta | {"config": {"graphs": 256}}, tmp_path)
    assert results.exclusion(replay) == "replayed CUDA graphs"
    flat = _sample(row | {"route": "flat"}, meta, tmp_path)
    assert flat.min_bytes > flat.size  # the row's own route wins over the rule
    assert flat.plan == "pipelined" and \
        _sample(row | {"route": "one-slice"}, meta, tmp_path).plan == "one-slice"
    int8 = _sample(row | {"route": "compressed int8"}, meta, tmp_path)
    assert results.exclusion(int8) == "quantized wire (compressed route)"
    # A run under NCCL_ALGO is priced with that algorithm, not the tuner's pick.
    tree = _sample(row, meta | {"nccl_env": {"NCCL_ALGO": "allreduce:tree"}}, tmp_path)
    costs = calibrate.prior(tree)
    c = calibrate.cluster_for(tree, costs)
    assert calibrate.predict(tree, costs)[1] == pytest.approx(tree_time_us(tree.size, c))


def test_cli_prints_the_table_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    png = tmp_path / "speedup.png"
    rows = cli.main(["--preset", "a100-4x200", "--machines", "2", "64", "--sizes", "25M",
                     "--buckets", "4", "--plot", str(png)])
    out = capsys.readouterr().out
    assert "MODEL" in out and len(rows) == 2
    assert all(math.isfinite(r["vs_tree"]) and r["rr"] > 0 for r in rows)
    assert all(r["vs_best"] == min(r["vs_ring"], r["vs_tree"]) for r in rows)
    assert png.stat().st_size > 10_000


def test_cli_calibrate_carries_the_fitted_host_cost(capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    run = ROOT / "benchmarks/results/2026-11-23-h200x2-core/capped_2x1.json"
    cli.main(["--calibrate", str(run), "--machines", "2", "--sizes", "25M"])
    out = capsys.readouterr().out
    assert "costs [capped 20 Gbit/s" in out
    host = float(out.split("host ")[-1].split(" us/call")[0])
    assert host != PRESETS["dgx-h100"].host_call_us  # the fit, not the preset


def test_cli_without_arguments_sweeps_2_to_1024_machines(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    rows = cli.main([])
    assert sorted({r["machines"] for r in rows}) == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert "dgx-h100" in capsys.readouterr().out


def test_cli_rejects_a_bad_size() -> None:
    with pytest.raises(SystemExit):
        cli.main(["--sizes", "lots"])


def test_cli_validate_says_where_the_validation_went(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--validate"])
    assert "python -m benchmarks.model_validation" in capsys.readouterr().err


def test_results_from_before_the_call_size_rule_keep_their_fixed_slices() -> None:
    """A run whose engine line shows one slice size is replayed with it, not with today's
    rule (which cuts calls under 16 MiB into four slices at 2 x 2)."""
    old = {"engine": "2 machines x 2 devices, slice_bytes=4194304, staging_bytes=67108864"}
    new = {"engine": "2 machines x 2 devices, slice_bytes=1048576..4194304, staging_bytes=1"}
    assert results._slice_bytes({}, old) == 4 << 20
    assert results._slice_bytes({}, new) is None
    assert results._slice_bytes({"slice_bytes": 4096}, new) == 4096


def test_every_presets_table_says_how_far_its_d_rests_on_measurement(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 51 item 4: the presets (8 GPUs a machine) say that D = 8 was not measured and
    how far beyond the largest measured D and link they reach; a measured D says so."""
    from ringreduce.model.cluster import MEASURED_GPUS, MEASURED_NET_GBPS

    cli.main(["--all-presets", "--machines", "2", "--sizes", "25M"])
    notes = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# measured:")]
    assert len(notes) == len(PRESETS)
    for note, c in zip(notes, PRESETS.values(), strict=True):
        assert c.gpus not in MEASURED_GPUS
        assert f"D = {c.gpus} not measured ({c.gpus / max(MEASURED_GPUS):g}x" in note
        assert f"network {c.net_gbps / max(MEASURED_NET_GBPS):g}x" in note
    cli.main(["--machines", "2", "--sizes", "25M", "--gpus-per-machine", "4",
              "--machine-net-gbps", "10"])
    (note,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# measured:")]
    assert f"D = 4 measured ({MEASURED_GPUS[4]})" in note and "network" not in note
