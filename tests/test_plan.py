"""Pure planning modules: no torch.distributed, no processes."""

from __future__ import annotations

import functools
import itertools

import pytest

from ringreduce.config import Config, internal_settings
from ringreduce.plan import layout, schedule, slicing, topology

GEOMETRIES = [(1, 2), (2, 2), (4, 1), (3, 2), (8, 4), (1, 1)]


@pytest.mark.parametrize("devices,machines", GEOMETRIES)
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_slices_cover_every_element_once(devices: int, machines: int, itemsize: int) -> None:
    group = devices * machines
    for numel, slice_bytes in itertools.product(
            [0, 1, group - 1, group, group + 1, 1000, 65537], [1, 64, 4096, 1 << 20]):
        plans = layout.plan_slices(numel, itemsize, devices, machines, slice_bytes)
        covered = [i for p in plans for i in range(p.offset, p.offset + p.numel)]
        assert covered == list(range(numel)), (numel, slice_bytes)
        for p in plans:
            assert p.body == devices * machines * p.k
            assert 0 <= p.tail < group
            assert p.tail == 0 or p is plans[-1], "only the last slice may have a tail"
            assert p.numel * itemsize <= max(slice_bytes, group * max(itemsize, 16))


def test_full_slices_are_aligned() -> None:
    plans = layout.plan_slices(10_000_000, 2, 4, 2, 4 << 20)
    for p in plans[:-1]:
        assert (p.k * 2) % layout.ALIGN_BYTES == 0 and (p.offset * 2) % layout.ALIGN_BYTES == 0
        assert p.numel * 2 <= 4 << 20


@pytest.mark.parametrize("devices,machines", [(1, 2), (2, 2), (4, 2), (8, 4), (3, 5)])
@pytest.mark.parametrize("slice_bytes", [1, 100, 4096, 4 << 20, (4 << 20) + 12])
def test_a_staging_slot_holds_every_dtypes_collect_rows(devices: int, machines: int,
                                                        slice_bytes: int) -> None:
    """What the engine receives into a slot in ``collect``: (M-1) rows of k elements of
    the largest slice of any dtype. The slot must hold them, 16-byte aligned."""
    slot, slots = layout.staging_geometry(devices, machines, slice_bytes, 64 << 20)
    assert slot % layout.ALIGN_BYTES == 0 and slots >= 2
    for itemsize in (1, 2, 4, 8):
        # three slices' worth or more: the first slice is a full one, the largest
        numel = 3 * (slice_bytes // itemsize + 64 * devices * machines)
        plans = layout.plan_slices(numel, itemsize, devices, machines, slice_bytes)
        assert len(plans) >= 2 and plans[0].numel == max(p.numel for p in plans)
        assert (machines - 1) * plans[0].k * itemsize <= slot, (itemsize, plans[0], slot)


def test_staging_slots_respect_budget() -> None:
    slot, slots = layout.staging_geometry(2, 2, 4 << 20, 64 << 20)
    assert (slot, slots) == (1 << 20, 64)  # 1 MiB shards, one row each: 64 slots
    assert layout.staging_geometry(2, 2, 4 << 20, 1) == (1 << 20, 2)  # never fewer than two
    assert layout.staging_geometry(4, 1, 4 << 20, 64 << 20) == (0, 0)  # one machine: none


def test_bad_plan_arguments_raise() -> None:
    with pytest.raises(ValueError, match="numel=-1"):
        layout.plan_slices(-1, 4, 2, 2, 1024)


def test_default_slice_grows_with_cluster() -> None:
    cfg = Config()
    assert cfg.resolved_slice_bytes(2, 2) == 4 << 20
    assert cfg.resolved_slice_bytes(8, 32) == 512 * 1024 * 256  # shard stays 512 KiB
    assert Config(slice_bytes=123).resolved_slice_bytes(8, 32) == 123


def test_a_small_call_is_cut_into_slices_that_still_overlap() -> None:
    cfg, mib = Config(), 1 << 20
    largest, smallest = cfg.resolved_slice_bytes(2, 2), cfg.smallest_slice_bytes(2, 2)
    assert (largest, smallest) == (4 * mib, mib)  # shards of 256 KiB at 2 x 2
    cut = functools.partial(layout.call_slice_bytes, largest=largest, smallest=smallest,
                            devices=2, machines=2)
    assert cut(25 * mib) == 4 * mib  # a DDP bucket: 7 slices, as before
    assert cut(16 * mib) == 4 * mib
    assert cut(8 * mib) == 2 * mib
    assert cut(4 * mib) == mib  # four slices, not one
    assert cut(3 * mib) == mib  # no slice below the smallest
    assert len(layout.plan_slices(mib, 4, 2, 2, cut(4 * mib))) == 4
    # sizes that are not whole 64-byte units (D*M*16 at 2 x 2) still make four slices,
    # not four and a sliver: the slice is rounded up, as plan_slices rounds down
    for extra in (4, 60, 64, 4092):
        nbytes = 4 * mib + extra
        assert cut(nbytes) % 64 == 0
        assert len(layout.plan_slices(nbytes // 4, 4, 2, 2, cut(nbytes))) == 4, extra
    # a given slice_bytes is one size for every call
    fixed = Config(slice_bytes=4096)
    assert fixed.smallest_slice_bytes(2, 2) == fixed.resolved_slice_bytes(2, 2) == 4096
    assert layout.call_slice_bytes(4 * mib, 4096, 4096) == 4096
    # at scale the smallest shard still binds: 8 x 32 (256 ranks) keeps 64 MiB slices
    assert cfg.smallest_slice_bytes(8, 32) == 64 * mib
    assert layout.call_slice_bytes(4 * mib, cfg.resolved_slice_bytes(8, 32),
                                   cfg.smallest_slice_bytes(8, 32)) == 64 * mib


def test_config_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGREDUCE_SLICE_BYTES", "0x1000")
    monkeypatch.setenv("RINGREDUCE_MIN_BYTES", "0")
    cfg = Config.from_env(staging_bytes=4096)
    assert (cfg.slice_bytes, cfg.min_bytes, cfg.staging_bytes) == (4096, 0, 4096)
    assert Config.from_env(min_bytes=7).min_bytes == 7  # arguments win
    monkeypatch.setenv("RINGREDUCE_MACHINES", "two")
    with pytest.raises(ValueError, match="RINGREDUCE_MACHINES='two'"):
        Config.from_env()
    with pytest.raises(ValueError, match="staging_bytes=-1"):
        Config(staging_bytes=-1)
    monkeypatch.setenv("RINGREDUCE_MACHINES", "2")
    assert Config().check_call_end
    for gone in ("graphs", "wave_groups", "pair_comms", "call_check_comms", "issue_probes",
                 "nccl_blocking"):
        assert not hasattr(Config(), gone), gone  # issue 36: switches kept only to measure
    monkeypatch.setenv("RINGREDUCE_DEBUG", "maybe")
    with pytest.raises(ValueError, match="RINGREDUCE_DEBUG='maybe' is not a boolean"):
        Config.from_env()


def test_config_names_variables_it_does_not_read(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Issue 39: the internal settings lost their variables; one still set (a user's
    environment from an older version) must not change behaviour silently."""
    monkeypatch.setenv("RINGREDUCE_ISSUER", "python")
    monkeypatch.setenv("RINGREDUCE_CHECK_CALL_END", "0")
    monkeypatch.setenv("RINGREDUCE_TIMEOUTT", "5")  # a typo
    with caplog.at_level("WARNING", logger="ringreduce"):
        cfg = Config.from_env()
        Config.from_env()  # named once, not per Communicator
    assert cfg.issuer is None and cfg.check_call_end  # not read
    text = [r.getMessage() for r in caplog.records]
    assert len(text) == 3, text
    assert "RINGREDUCE_ISSUER is set but no longer read (internal now: " \
           "Communicator(issuer=...))" in text[1]
    assert "RINGREDUCE_TIMEOUTT is set but is not a ringreduce variable" in text[2]
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['rail_channels'\]"):
        internal_settings({"issuer": "python", "rail_channels": 4})
    assert internal_settings({"issuer": "python"}) == {"issuer": "python"}


def test_topology_from_host_ids_groups_by_host() -> None:
    hosts = ["a", "b", "a", "b", "a", "b"]
    t = topology.from_host_ids(hosts, 3)
    assert (t.machines, t.devices_per_machine, t.machine_index, t.device_index) == (2, 3, 1, 1)
    assert t.intra_ranks() == (1, 3, 5) and t.rail_ranks() == (2, 3) and t.rank == 3
    assert t.all_rails() == ((0, 1), (2, 3), (4, 5))
    assert t.peers("reduce_scatter") == t.peers("all_gather") == (1, 3, 5)
    assert t.peers("collect") == t.peers("add") == t.peers("diffuse") == (2, 3)
    assert t.peers("flat") == t.peers("world") == tuple(range(6))


def test_unequal_machines_make_one_flat_machine() -> None:
    t = topology.from_host_ids(["a", "a", "b"], 2)
    assert (t.machines, t.devices_per_machine, t.machine_index, t.device_index) == (1, 3, 0, 2)
    assert t.ranks == ((0, 1, 2),) and t.rank == 2
    assert "spread unevenly over machines ('a': 2, 'b': 1)" in t.flat_reason
    assert topology.from_host_ids(["a", "b"], 0).flat_reason == ""


def test_virtual_machines_are_contiguous() -> None:
    t = topology.from_virtual(6, 3, 4)
    assert t.ranks == ((0, 1), (2, 3), (4, 5)) and (t.machine_index, t.device_index) == (2, 0)
    with pytest.raises(ValueError, match="machines=4 must divide the world size 6"):
        topology.from_virtual(6, 4, 0)


@pytest.mark.parametrize(("world", "machines", "choices"), [
    (4, 3, "machines=1, 2 or 4"), (6, 4, "machines=1, 2, 3 or 6"), (7, 2, "machines=1 or 7"),
    (1, 2, "machines=1$")])
def test_a_machines_that_does_not_divide_lists_every_divisor(world: int, machines: int,
                                                              choices: str) -> None:
    with pytest.raises(ValueError, match=f"choose a divisor of {world}: {choices}"):
        topology.from_virtual(world, machines, 0)


@pytest.mark.parametrize("devices", [1, 4])
def test_schedule_links_stages_and_reuses_slots_in_order(devices: int) -> None:
    stages = schedule.active_stages(devices)
    steps = schedule.plan_steps(7, True, devices, staging_slots=3)
    assert [s.stage for s in steps] == list(stages) * 7
    assert [s.staging_slot for s in steps] == [i % 3 for i in range(7) for _ in stages]
    recorded: dict[str, tuple[int, str]] = {}  # event -> (slice, stage) of last record
    for s in steps:
        for w in s.waits:
            if w.startswith("staging_free"):
                prev = recorded.get(w)  # must be the add of the slice 3 slots earlier
                assert prev is None or prev == (s.slice_index - 3, "add"), (s, prev)
            elif w.startswith("tail"):  # the previous call's last work on this stage
                assert s.slice_index == 0 and w == schedule.tail(s.stage) and w not in recorded
            elif w != schedule.ENTRY and not w.startswith("padding_free"):
                assert recorded[w] == (s.slice_index, stages[stages.index(s.stage) - 1])
        for r in s.records:
            recorded[r] = (s.slice_index, s.stage)
    assert schedule.ENTRY in steps[0].waits and schedule.DONE in steps[-1].records
    assert {r for s in steps for r in s.records if r.startswith("tail")} == \
        {r for s in steps if s.slice_index == 6 for r in s.records if r.startswith("tail")} == \
        {schedule.tail(stage) for stage in stages}
    assert all(s.padding_slot == 0 for s in steps if s.slice_index == 6)
    assert all(s.padding_slot is None for s in steps if s.slice_index < 6)
    names = set(schedule.event_names(devices, 3, layout.PADDING_SLOTS))
    assert {e for s in steps for e in (*s.waits, *s.records)} <= names


def test_consecutive_calls_reuse_slots_after_their_last_reader() -> None:
    """Every call starts at slot 0, so one kind of call has one plan (and one native
    program): what keeps it safe is that the next call's first writer of a slot waits
    for this call's last reader of it, for staging (collect after add) and padding
    (the tail's copy-in after the previous tail's copy-back)."""
    first = schedule.plan_steps(5, True, 2, staging_slots=3)
    assert schedule.plan_steps(5, True, 2, staging_slots=3) == first
    recorded: dict[str, tuple[int, int, str]] = {}  # event -> (call, slice, stage)
    for call in range(2):
        for s in first:
            for w in s.waits:
                if w.startswith("staging_free"):  # the last add that read the slot
                    if s.slice_index >= 3:  # an earlier slice of this call
                        last = (call, s.slice_index - 3, "add")
                    elif call:  # the previous call's last slice in this slot
                        last = (0, max(i for i in range(5) if i % 3 == s.staging_slot), "add")
                    else:
                        last = None
                    assert recorded.get(w) == last, (s, last)
                if call and w.startswith("padding_free"):
                    assert recorded[w] == (0, 4, "all_gather")
            for r in s.records:
                recorded[r] = (call, s.slice_index, s.stage)


def test_more_than_2_31_elements_are_planned_exactly() -> None:
    """Counts past int32 stay exact (Python ints here, size_t in NCCL)."""
    numel = 2**31 + 5
    plans = layout.plan_slices(numel, 2, 4, 2, 4 << 20)
    assert sum(p.numel for p in plans) == numel
    assert plans[-1].offset + plans[-1].numel == numel and plans[-1].tail == 5 % 8
    assert all(p.offset == i * plans[0].numel for i, p in enumerate(plans))


def test_plan_call_is_the_memoised_plan_of_slices_and_steps() -> None:
    plans, steps = schedule.plan_call(1_000_003, 4, 2, 2, 65536, 8, "add")
    want_plans = layout.plan_slices(1_000_003, 4, 2, 2, 65536)
    want_steps = schedule.plan_steps(len(want_plans), want_plans[-1].tail > 0, 2, 8, "add")
    assert (plans, steps) == (want_plans, want_steps)
    assert schedule.plan_call(1_000_003, 4, 2, 2, 65536, 8, "add")[1] is steps


def test_the_plan_package_imports_only_the_standard_library_and_itself() -> None:
    """ringreduce/plan is pure (its docstring's rule): no torch, no devices, so the
    model and these tests reason about a call without them."""
    import ast
    import sys
    from pathlib import Path

    plan = Path(__file__).resolve().parent.parent / "ringreduce" / "plan"
    for path in plan.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1, f"{path.name}: from {'.' * node.level}{node.module}"
                continue
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names]
                for name in names:
                    top = (name or "").split(".")[0]
                    assert top in sys.stdlib_module_names or name.startswith(
                        "ringreduce.plan"), f"{path.name} imports {name}"


def test_sizes_parse_as_the_command_lines_write_them() -> None:
    """One parser for the bench's and the model's sizes (sizes.parse_size)."""
    import argparse

    from ringreduce.sizes import parse_size

    assert [parse_size(s) for s in ("4096", "64M", "64mb", "1.5G", " 2K ")] == \
        [4096, 64 << 20, 64 << 20, 3 << 29, 2048]
    for bad in ("", "M", "64T", "-1M", "1e6"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"e\.g\. 64M"):
            parse_size(bad)


def _seen(order: list[list[schedule.Step]]) -> dict[tuple[int, str, str], tuple[int, str] | None]:
    """For each (slice, stage, event) wait: which step's record it sees, when each wave
    enqueues its grouped steps' waits, then their records, then each add step's waits
    and records in turn (how run_waves issues a wave)."""
    latest: dict[str, tuple[int, str]] = {}
    seen: dict[tuple[int, str, str], tuple[int, str] | None] = {}

    def issue(phase: list[schedule.Step]) -> None:
        for s in phase:
            for w in s.waits:
                seen[(s.slice_index, s.stage, w)] = latest.get(w)
        for s in phase:
            for r in s.records:
                latest[r] = (s.slice_index, s.stage)

    for wave in order:
        issue([s for s in wave if s.stage != schedule.AFTER_GROUP])
        for s in wave:
            if s.stage == schedule.AFTER_GROUP:
                issue([s])
    return seen


@pytest.mark.parametrize("devices,slots,reader", [(2, 8, "add"), (2, 1, "add"),
                                                  (2, 2, "diffuse"), (1, 3, "add"),
                                                  (4, 1, "diffuse")])
def test_waves_see_the_records_that_slice_major_order_sees(devices: int, slots: int,
                                                           reader: str) -> None:
    steps = schedule.plan_steps(9, True, devices, staging_slots=slots, slot_reader=reader)
    waves = schedule.waves(steps)
    assert sorted(steps, key=id) == sorted((s for w in waves for s in w), key=id)  # each once
    assert _seen([[s] for s in steps]) == _seen([list(w) for w in waves])
    for stage in schedule.active_stages(devices):  # a stream's steps keep slice order
        on = [s.slice_index for w in waves for s in w if s.stage == stage]
        assert on == sorted(on) and len(set(on)) == len(on)
    if slots >= 4:  # the pipeline's full width: one wave per slice, plus its depth, the
        # add going out with its collect's wave
        assert len(waves) == 9 + len(schedule.active_stages(devices)) - 2
    for wave in waves:  # every wave has an NCCL group, and the add follows its collect
        assert any(s.stage != schedule.AFTER_GROUP for s in wave)
        for s in wave:
            if s.stage == schedule.AFTER_GROUP:
                assert (s.slice_index, "collect") in [(x.slice_index, x.stage) for x in wave]


def test_config_names_the_plans_of_plan_slicing() -> None:
    """config.py validates Config.plan against its own copy of the names (it sits below
    the plan package); they must stay the same."""
    from ringreduce import config
    from ringreduce.plan import slicing
    assert config.PLANS == slicing.PLANS


MiB = 1 << 20


def _timing(nbytes: int = 16 * MiB, **passes: tuple[float, ...]) -> slicing.Timing:
    return slicing.Timing(nbytes, {k.replace("_", "-"): v for k, v in passes.items()})


def test_the_probe_takes_the_fastest_route_and_says_by_how_much() -> None:
    for fast, want in (("flat", slicing.FLAT), ("one_slice", slicing.ONE_SLICE),
                       ("pipelined", slicing.PIPELINED)):
        times = {"flat": (0.020, 0.020), "one_slice": (0.021, 0.021),
                 "pipelined": (0.022, 0.022), fast: (0.010, 0.010)}
        chosen = slicing.choose_at(_timing(**times))
        assert (chosen.plan, chosen.wire) == (want, True), chosen
        runner = min((v[0], k.replace("_", "-")) for k, v in times.items() if k != fast)
        assert f"{want} is the fastest, by {runner[0] / 0.010 - 1:.1%} over {runner[1]}" \
            in chosen.reason, chosen.reason
        assert "probe at 16 MiB" in chosen.reason and "10.00 ms" in chosen.reason


def test_two_level_is_taken_where_it_is_fastest_beyond_the_margin() -> None:
    times = {"flat": (0.020,), "one_slice": (0.0105,), "two_level": (0.0100,),
             "pipelined": (0.0110,)}
    chosen = slicing.choose_at(_timing(**times))
    assert chosen.two_level and chosen.unsliced and not chosen.one_slice, chosen
    assert "two-level 10.00 ms" in chosen.reason and \
        "two-level is the fastest, by 5.0% over one-slice" in chosen.reason, chosen.reason
    assert chosen.why.startswith("plan=two-level: probe at 16 MiB")
    # within the margin of two-level, one slice issues fewer collectives: one slice
    close = slicing.choose_at(_timing(**{**times, "one_slice": (0.01005,)}))
    assert close.one_slice and "within the margin of two-level" in close.reason
    # and two-level before the pipeline, within the margin of it
    piped = slicing.choose_at(_timing(**{**times, "one_slice": (0.02,), "pipelined": (0.00995,)}))
    assert piped.two_level and "within the margin of pipelined" in piped.reason


def test_within_the_margin_the_route_with_fewer_collectives_is_taken() -> None:
    # flat 0.5% slower than one slice, the passes alike: the margin's floor (1%) covers it
    chosen = slicing.choose_at(_timing(flat=(0.01005,), one_slice=(0.0100,),
                                       pipelined=(0.0101,)))
    assert chosen.flat and "within the margin of one-slice (0.5% slower)" in chosen.reason
    # one slice within 1% of the pipeline: one slice
    assert slicing.choose_at(_timing(flat=(0.02,), one_slice=(0.01009,),
                                     pipelined=(0.0100,))).one_slice


def test_the_margin_is_the_probes_spread_clamped() -> None:
    # flat's best pass 2% slower than one slice's
    quiet = _timing(flat=(0.0102, 0.0103), one_slice=(0.0100, 0.0100))
    noisy = _timing(flat=(0.0102, 0.0105), one_slice=(0.0100, 0.0100))
    assert slicing.margin(quiet) == slicing.MIN_MARGIN  # spread 0.98%: the floor
    assert slicing.margin(noisy) == pytest.approx(0.0105 / 0.0102 - 1)
    assert slicing.choose_at(quiet).one_slice  # 2% is beyond the noise
    assert slicing.choose_at(noisy).flat  # 2% is within it
    assert "margin 2.9% (the passes' spread)" in slicing.choose_at(noisy).reason
    wild = _timing(flat=(0.0104, 0.02), one_slice=(0.0100, 0.0100))
    assert slicing.margin(wild) == slicing.MAX_MARGIN
    assert slicing.choose_at(wild).one_slice  # 4% slower: beyond the ceiling


def test_a_lossy_wire_is_taken_only_where_exact_is_slower() -> None:
    exact = {"flat": (0.016,), "one_slice": (0.014,), "pipelined": (0.015,)}
    fast = slicing.choose_at(_timing(**exact, wire=(0.004,)))
    assert (fast.plan, fast.wire) == (slicing.ONE_SLICE, True)
    assert "the wire is faster than one-slice by 250.0%" in fast.reason
    for wire in (0.0139, 0.014, 0.020):  # within the margin, as fast, slower: exact
        chosen = slicing.choose_at(_timing(**exact, wire=(wire,)))
        assert (chosen.plan, chosen.wire) == (slicing.ONE_SLICE, False), wire
        assert "exact taken" in chosen.reason and "wire=exact" in chosen.why


def test_two_probe_sizes_split_at_their_geometric_mean() -> None:
    small = _timing(4 * MiB, flat=(0.004,), one_slice=(0.003,), pipelined=(0.005,))
    large = _timing(16 * MiB, flat=(0.016,), one_slice=(0.014,), pipelined=(0.010,))
    chosen = slicing.choose([large, small])
    assert chosen.split_bytes == 8 * MiB and chosen.below is not None
    assert chosen.at(1).one_slice and chosen.at(8 * MiB - 1).one_slice
    assert chosen.at(8 * MiB).plan == chosen.at(1 << 30).plan == slicing.PIPELINED
    assert chosen.summary.startswith("below 8 MiB: plan=one-slice: probe at 4 MiB")
    assert "; from 8 MiB: plan=pipelined: probe at 16 MiB" in chosen.summary
    one = slicing.choose([large])
    assert one.below is None and one.at(1) is one and one.summary == one.why


def test_the_probes_sizes_and_calls() -> None:
    assert slicing.probe_sizes(1 * MiB) == (4 * MiB, 16 * MiB)
    assert slicing.probe_sizes(8 * MiB) == (8 * MiB, 16 * MiB)
    assert slicing.probe_sizes(32 * MiB) == (32 * MiB,)
    # a route's warm-up right before each of its passes, then a pass's queued calls
    per_route = slicing.PROBE_WARMUP + (slicing.PROBE_PASSES - 1) * slicing.PROBE_REWARM + \
        slicing.PROBE_PASSES * slicing.PROBE_ROUNDS
    assert slicing.probe_calls_per_route() == per_route
    assert slicing.PROBE_ROUNDS > 1 and slicing.PROBE_REWARM >= 1  # calls queue; links woken
    # flat, one slice, two-level, the pipeline; and the wire
    assert slicing.probe_calls(1 * MiB, False) == 2 * 4 * per_route
    assert slicing.probe_calls(32 * MiB, True) == 1 * 5 * per_route


def test_the_probes_times_are_checked() -> None:
    for bad in ((0.0,), (-1.0,), (float("nan"),), (float("inf"),), ()):
        with pytest.raises(ValueError, match="positive and finite"):
            slicing.choose_at(_timing(flat=bad, one_slice=(0.01,)))
    with pytest.raises(ValueError, match="no exact route"):
        slicing.choose_at(_timing(wire=(0.01,)))
    with pytest.raises(ValueError, match="is not one of"):
        slicing.choose_at(_timing(flat=(0.01,), sliced=(0.01,)))
    with pytest.raises(ValueError, match="one or two sizes"):
        slicing.choose([_timing(flat=(0.01,))] * 3)
