"""Properties of the pure planner, over many random problems (hypothesis)."""

import math
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xarray_memchunk import Budget, InfeasiblePlanError
from xarray_memchunk.memory_limits import make_budget
from xarray_memchunk.planning.balance import balanced_chunks
from xarray_memchunk.planning.budget import IN_PROCESS_BASELINE, MEASURED_BASELINE
from xarray_memchunk.planning.footprint import GRAPH_TASK_BYTES, InputKind, InputLayout
from xarray_memchunk.planning.plan import Binding
from xarray_memchunk.planning.problem import DimRole, DimSpec, PlanProblem
from xarray_memchunk.planning.search import plan_chunks, plan_for_chunks


def linear_peak(bytes_per_element, constant=0):
    def peak(extents):
        return constant + bytes_per_element * np.prod(
            [np.asarray(v, dtype=float) for v in extents.values()], axis=0
        )

    return peak


def budget(per_task, threads=2):
    return Budget(
        worker_memory=per_task * 4,
        threads_per_worker=1,
        n_workers=threads,
        per_task=per_task,
        source="test",
        worker_baseline=0,
        reserve=0.0,
        pause_fraction=1.0,
    )


dim_strategy = st.builds(
    lambda size, role, depth, storage: (size, role, depth, storage),
    st.integers(1, 400),
    st.sampled_from([DimRole.FREE, DimRole.HALO, DimRole.WHOLE]),
    st.integers(0, 6),
    st.one_of(st.none(), st.integers(1, 120)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dims=st.lists(dim_strategy, min_size=1, max_size=4),
    bpe=st.floats(1, 100),
    per_task=st.integers(10_000, 50_000_000),
    threads=st.integers(1, 8),
)
def test_plans_fit_are_balanced_and_respect_roles(dims, bpe, per_task, threads):
    specs = tuple(
        DimSpec(f"d{i}", size, role, depth if role is DimRole.HALO else 0, storage)
        for i, (size, role, depth, storage) in enumerate(dims)
    )
    problem = PlanProblem("test", specs, linear_peak(bpe))
    try:
        plan = plan_chunks(problem, budget(per_task, threads))
    except InfeasiblePlanError as err:
        # infeasible only if even the smallest allowed chunks are over budget
        smallest = math.prod(
            s.size if s.role is DimRole.WHOLE else (min(s.size, 3 * max(1, s.depth))) for s in specs
        )
        if "memchunk.max-tasks" in str(err):  # only chunkings of more than the cap fit
            assert problem.max_tasks < math.prod(s.size for s in specs)
            return
        assert bpe * smallest > per_task or "cannot fit" in str(err)
        assert "per task" in str(err) and "memory_limit" in str(err)
        return
    assert plan.predicted_peak_bytes <= per_task
    for spec in specs:
        chunks = plan.dask_chunks[spec.name]
        assert sum(chunks) == spec.size
        if spec.role is DimRole.WHOLE:
            assert chunks == (spec.size,)
        if spec.role is DimRole.HALO and len(chunks) > 1:
            assert min(chunks) >= max(1, spec.depth)
        # balanced: chunks differ by at most one unit, the dim's storage chunk where the plan
        # split this dim in storage chunks (plan.storage_aligned says all dims were), else 1
        in_storage = spec.storage_chunk and all(c % spec.storage_chunk == 0 for c in chunks[:-1])
        unit = spec.storage_chunk if in_storage and len(chunks) > 1 else 1
        if plan.storage_aligned:
            assert unit == spec.storage_chunk or len(chunks) == 1 or not spec.storage_chunk
        assert max(chunks[:-1] or chunks) - min(chunks[:-1] or chunks) <= unit
        assert plan.chunks[spec.name] == max(chunks)
    assert plan.n_chunks == math.prod(len(c) for c in plan.dask_chunks.values())


def test_balanced_never_uneven():
    assert balanced_chunks(200, 2) == (100, 100)
    assert balanced_chunks(201, 2) == (101, 100)


def test_memory_binds_and_splits_evenly():
    specs = tuple(DimSpec(n, 200, DimRole.FREE) for n in "xyz")
    problem = PlanProblem("op", specs, linear_peak(100.0))
    plan = plan_chunks(problem, budget(int(100 * 200**3 / 40)))
    assert plan.binding == Binding.MEMORY
    assert plan.n_chunks >= 40
    assert plan.predicted_peak_bytes <= plan.budget.per_task
    for chunks in plan.dask_chunks.values():
        assert max(chunks) - min(chunks) <= 1  # never 159 + 41


def test_the_measured_range_binds_where_larger_chunks_fit_the_budget_but_not_the_range():
    specs = tuple(DimSpec(n, 200, DimRole.FREE) for n in "xyz")
    per_task = int(100 * 200**3 / 40)  # larger chunks than the range allows fit the budget
    ranged = PlanProblem("op", specs, linear_peak(100.0), max_task_elements=200**3 / 400)
    plan = plan_chunks(ranged, budget(per_task))
    assert plan.binding == Binding.MODEL_RANGE
    assert math.prod(max(c) for c in plan.dask_chunks.values()) <= 200**3 / 400
    # a range wider than the budget allows leaves the budget binding
    wide = PlanProblem("op", specs, linear_peak(100.0), max_task_elements=200**3 / 4)
    assert plan_chunks(wide, budget(per_task)).binding == Binding.MEMORY


def test_parallelism_when_memory_is_plentiful():
    specs = (DimSpec("x", 1000), DimSpec("y", 1000))
    problem = PlanProblem("op", specs, linear_peak(4.0), seconds_per_element=1e-8)
    plan = plan_chunks(problem, budget(10**12, threads=4))
    assert plan.n_chunks >= 4
    assert plan.binding == Binding.PARALLELISM


def test_tiny_data_stays_one_chunk():
    problem = PlanProblem("op", (DimSpec("x", 10),), linear_peak(4.0))
    plan = plan_chunks(problem, budget(10**9, threads=4))
    assert plan.n_chunks == 1 and plan.binding == Binding.TASK_OVERHEAD


def test_storage_alignment_taken_when_cheap():
    # 1000 elements in storage chunks of 100; an aligned split is as fast as any other
    problem = PlanProblem(
        "op", (DimSpec("x", 1000, storage_chunk=100), DimSpec("y", 64)), linear_peak(1000.0)
    )
    plan = plan_chunks(problem, budget(1000 * 64 * 260))
    assert plan.storage_aligned
    assert all(c % 100 == 0 for c in plan.dask_chunks["x"][:-1])


def test_storage_alignment_given_up_is_explained():
    # storage chunks are whole-dim: any fitting plan must cut them
    problem = PlanProblem("op", (DimSpec("x", 1000, storage_chunk=1000),), linear_peak(1000.0))
    plan = plan_chunks(problem, budget(1000 * 300))
    assert not plan.storage_aligned
    assert "alignment given up" in plan.explain()


def test_halo_dims_prefer_low_overhead():
    # as many tasks as a slab split would make, but cubes: the least halo per voxel
    specs = tuple(DimSpec(n, 200, DimRole.HALO, depth=9) for n in "xyz")
    problem = PlanProblem("op", specs, linear_peak(40.0), seconds_per_element=3e-7)
    plan = plan_chunks(problem, budget(800_000_000, threads=2))
    assert plan.n_chunks == 8
    assert sorted(len(c) for c in plan.dask_chunks.values()) == [2, 2, 2]
    assert plan.halo == {"x": 9, "y": 9, "z": 9}


def test_halo_is_modelled_in_the_padded_extent():
    specs = (DimSpec("x", 100, DimRole.HALO, depth=5), DimSpec("y", 10))
    problem = PlanProblem("op", specs, linear_peak(1.0))
    two = plan_for_chunks(problem, budget(10**6), {"x": (50, 50), "y": (10,)})
    three = plan_for_chunks(problem, budget(10**6), {"x": (34, 33, 33), "y": (10,)})
    assert two.predicted_peak_bytes == (50 + 5) * 10  # one neighbour
    assert three.predicted_peak_bytes == (34 + 10) * 10  # interior chunk: two neighbours


def test_infeasible_states_minimum_and_remedy():
    specs = (DimSpec("time", 10_000, DimRole.WHOLE), DimSpec("x", 10))
    problem = PlanProblem("median", specs, linear_peak(16.0))
    with pytest.raises(InfeasiblePlanError) as err:
        plan_chunks(problem, budget(100_000))
    text = str(err.value)
    assert "156.25 kiB" in text  # 16 B x 10,000 x 1: the smallest task
    assert "memory_limit" in text and "time" in text


def test_user_chunks_plan_reports_prediction():
    specs = (DimSpec("x", 100), DimSpec("y", 100))
    problem = PlanProblem("op", specs, linear_peak(10.0))
    plan = plan_for_chunks(problem, budget(10**6), {"x": (50, 50), "y": (100,)})
    assert plan.binding == Binding.USER_CHUNKS
    assert plan.n_chunks == 2
    assert plan.predicted_peak_bytes == 10 * 50 * 100
    assert plan.fits


@pytest.mark.parametrize("measured", [True, False])
def test_infeasible_names_memory_left_from_earlier_work(measured):
    """A baseline measured on the workers (left from earlier work) is named, with a remedy."""
    specs = (DimSpec("time", 10_000, DimRole.WHOLE), DimSpec("x", 10))
    problem = PlanProblem("median", specs, linear_peak(16.0))
    held = Budget(
        worker_memory=1_000_000_000,
        threads_per_worker=1,
        n_workers=2,
        per_task=100_000,
        source="test",
        worker_baseline=514_000_000,
        pause_fraction=0.8,
        baseline_source=MEASURED_BASELINE if measured else "",
    )
    with pytest.raises(InfeasiblePlanError) as err:
        plan_chunks(problem, held)
    assert ("client.restart()" in str(err.value)) is measured


def test_infeasible_for_workers_in_this_process_counts_their_threads_in_all():
    """Workers of a ``processes=False`` cluster are planned as one of all their threads."""
    specs = (DimSpec("time", 10_000_000, DimRole.WHOLE), DimSpec("x", 10))
    problem = PlanProblem("median", specs, linear_peak(16.0))  # 160 MB a column
    merged = make_budget(
        1_000_000_000,
        4,
        1,
        "test",
        worker_baseline=700_000_000,
        baseline_source=IN_PROCESS_BASELINE,
        in_this_process=True,
    )
    with pytest.raises(InfeasiblePlanError) as err:
        plan_chunks(problem, merged)
    message = str(err.value)
    assert "(memory_limit) at 4 threads in all in this process" in message
    assert "or run fewer threads in all (workers x threads per worker)" in message
    assert message.count("processes=True") == 1 and "per worker (each thread" not in message
    small = make_budget(1_000_000_000, 4, 1, "test", in_this_process=True)  # configured baseline
    with pytest.raises(InfeasiblePlanError) as err:
        plan_chunks(problem, small)
    assert "in processes of their own (processes=True)" in str(err.value)


def test_infeasible_under_a_hand_built_budget_asks_for_a_larger_per_task_budget():
    """Issue 33: a given per_task was answered "give each worker at least 84.73 MiB" (of 1 GB)."""
    specs = (DimSpec("time", 10_000, DimRole.WHOLE), DimSpec("x", 10))
    problem = PlanProblem("median", specs, linear_peak(16.0))
    given = Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=100_000, source="test"
    )
    with pytest.raises(InfeasiblePlanError) as err:
        plan_chunks(problem, given)
    message = str(err.value)
    assert "give each task at least 156.25 kiB (Budget.per_task)" in message
    assert "give each worker" not in message and "fewer threads" not in message
    assert "per-task budget 97.66 kiB as given (source: test)" in message
    assert err.value.minimum_memory_limit is None  # no memory_limit decides a given per_task


def test_the_minimum_a_refusal_states_is_kept_and_suffices():
    from xarray_memchunk.units import format_size_up

    specs = (DimSpec("time", 10_000, DimRole.WHOLE), DimSpec("x", 10))
    problem = PlanProblem("median", specs, linear_peak(16.0))
    with pytest.raises(InfeasiblePlanError) as err:
        plan_chunks(problem, make_budget(300_000, 2, 1, "test", worker_baseline=0))
    minimum = err.value.minimum_memory_limit
    assert f"at least {format_size_up(minimum)} (memory_limit)" in str(err.value)
    plan = plan_chunks(problem, make_budget(minimum, 2, 1, "test", worker_baseline=0))
    assert plan.predicted_peak_bytes <= plan.budget.per_task
    with pytest.raises(InfeasiblePlanError):
        plan_chunks(problem, make_budget(int(minimum * 0.99), 2, 1, "test", worker_baseline=0))


def test_a_stated_minimum_is_one_at_which_a_chunking_within_the_measured_range_fits():
    # the input comes from a Dask graph in one 4000 x 4000 float64 chunk: a plan of that one
    # chunk holds nothing beside its task, where smaller chunks also hold the 128 MB they are
    # cut from. The least peak of all is then the whole array, beyond the model's measured
    # range (trial 391: a refusal's minimum at which the plan was refused again, for the range)
    n = 4000
    specs = tuple(DimSpec(d, n, DimRole.FREE, storage_chunk=n) for d in "xy")
    source = InputLayout("v", ("x", "y"), 8, InputKind.GRAPH, {"x": n, "y": n})
    problem = PlanProblem(
        "op", specs, linear_peak(10.0), inputs=(source,), max_task_elements=n * n / 4
    )
    with pytest.raises(InfeasiblePlanError) as refused:
        plan_chunks(problem, make_budget(400 * 10**6, 1, 2, "test"))
    needed = refused.value.minimum_memory_limit
    at_minimum = make_budget(needed, 1, 2, "test")
    plan = plan_chunks(problem, at_minimum)  # runs where the refusal said it would
    assert math.prod(max(c) for c in plan.dask_chunks.values()) <= n * n / 4
    assert plan.predicted_peak_bytes <= at_minimum.per_task


def test_a_plan_of_more_tasks_than_the_cap_is_refused_with_a_minimum_that_keeps_within_it():
    """A new user's groupby planned at a refusal's stated minimum had 2,803,200 tasks: its
    input held 1.5 GiB per task whatever the chunks, and only the smallest fitted beside it."""
    specs = (DimSpec("time", 1000, DimRole.WHOLE), DimSpec("x", 2000), DimSpec("y", 500))
    problem = PlanProblem("op", specs, linear_peak(8.0, constant=100e6), max_tasks=1000)
    per_task = 100e6 + 8 * 1000 * 125  # time x 125 elements fit: 8,000 tasks
    fits_only_many = make_budget(int(per_task / 0.72), 1, 1, "test", worker_baseline=0)
    assert plan_chunks(replace(problem, max_tasks=10**6), fits_only_many).n_chunks > 1000
    with pytest.raises(InfeasiblePlanError, match="has more than 1,000 chunks") as err:
        plan_chunks(problem, fits_only_many)
    assert re.search(r"\(at least [\d,]+\)", str(err.value))
    assert "memchunk.max-tasks" in str(err.value)
    assert "cannot fit one task" not in str(err.value)  # it can: in more chunks
    least = err.value.minimum_memory_limit
    at_minimum = make_budget(least, 1, 1, "test", worker_baseline=0)
    plan = plan_chunks(problem, at_minimum)
    assert plan.n_chunks <= 1000 and plan.predicted_peak_bytes <= at_minimum.per_task


def test_a_plan_the_cap_kept_from_more_chunks_says_so():
    """A review: with max-tasks 2, a median planned in 36 chunks for parallelism had 2, and
    blamed the model's measured range."""
    specs = (DimSpec("time", 1000, DimRole.WHOLE), DimSpec("x", 2000))
    problem = PlanProblem("op", specs, linear_peak(8.0))
    assert plan_chunks(problem, budget(10**9, threads=8)).n_chunks > 2
    capped = plan_chunks(replace(problem, max_tasks=2), budget(10**9, threads=8))
    assert capped.n_chunks <= 2 and capped.binding == Binding.MAX_TASKS


def test_the_variables_of_a_dataset_share_the_cap_a_task_per_chunk_of_each():
    """A plan's operator tasks are its chunks times its variables: 4 variables in the
    cap's 1,000 chunks were 4,000 tasks."""
    specs = (DimSpec("time", 1000, DimRole.WHOLE), DimSpec("x", 2000))
    one = PlanProblem("op", specs, linear_peak(8000.0), max_tasks=1000)
    chunks = {"time": 1000, "x": 4}
    layouts = tuple(InputLayout(v, ("time", "x"), 4, InputKind.MEMORY, chunks) for v in "abcd")
    four = replace(one, inputs=layouts)
    assert (one.max_chunks, replace(one, inputs=layouts[:1]).max_chunks) == (1000, 1000)
    assert four.max_chunks == 250
    # time x 4 elements: 500 chunks, each a cut and a task Dask keeps a record of
    fits_only_many = budget(8000 * 1000 * 4 + 2 * 500 * GRAPH_TASK_BYTES, threads=1)
    assert plan_chunks(replace(one, inputs=layouts[:1]), fits_only_many).n_chunks == 500
    # the same chunks of 4 variables: 4 x the graph's tasks
    fits_only_many = budget(8000 * 1000 * 4 + 4 * 2 * 500 * GRAPH_TASK_BYTES, threads=1)
    with pytest.raises(InfeasiblePlanError, match="more than 250 chunks") as err:
        plan_chunks(four, fits_only_many)
    assert "1,000 tasks shared by its 4 variables" in str(err.value)


def test_a_dataset_s_plan_says_its_operator_tasks_in_all(threaded):
    """A new user's 4 variables under max-tasks 50: "tasks 12", and the graph had 48."""
    import dask

    from xarray_memchunk.datasets import synthetic_climate

    ds = synthetic_climate(100, 20, 30, chunks={"time": 10})
    ds = ds.assign(pr=ds.tas * 2, ps=ds.tas + 1)
    with dask.config.set({"memchunk.max-tasks": 30}):
        plan = ds.memchunk.plan("median", dim="time", memory_limit="1GB")
    n = len([v for v in ds.data_vars if "time" in ds[v].dims])
    note = f"{plan.n_chunks * n:,} operator tasks in all: a task per chunk of each of the {n}"
    assert n > 1 and plan.n_chunks * n <= 30 and any(note in x for x in plan.notes)
    # a variable without a cut dim has fewer chunks (a review: 16 said, 9 in the graph)
    mixed = ds.assign(zm=ds.tas.mean("lon")).memchunk.plan(
        "median", dim="time", memory_limit="1GB", chunks={"lon": 10}
    )
    per_var = {"tas": 3, "pr": 3, "ps": 3, "zm": 1}
    assert mixed.n_chunks == 3
    assert any(f"{sum(per_var.values())} operator tasks in all" in x for x in mixed.notes)


def test_the_cap_holds_where_no_chunking_within_it_is_in_the_measured_range():
    """A new user's max-tasks of 2 gave a plan of 22 tasks, silently: no chunking of 2 was
    within the self-calibrated model's range, and the cap was dropped for it."""
    specs = (DimSpec("x", 1000), DimSpec("y", 1000))
    problem = PlanProblem("op", specs, linear_peak(8.0), max_task_elements=10_000, max_tasks=2)
    with pytest.raises(InfeasiblePlanError, match="measured on") as err:
        plan_chunks(problem, make_budget(10**9, 1, 1, "test", worker_baseline=0))
    assert "memchunk.max-tasks" in str(err.value)


def test_a_range_below_every_chunking_is_refused_for_the_range_with_no_minimum():
    # a halo of 10 pads the smallest task to 21 elements: none within a range of 16, and none
    # fits the budget either (10 MB an element): no memory_limit would let it run
    halo = DimSpec("x", 100, DimRole.HALO, depth=10)
    problem = PlanProblem("op", (halo,), linear_peak(1e7), max_task_elements=16)
    with pytest.raises(InfeasiblePlanError, match="every chunking it allows has tasks") as err:
        plan_chunks(problem, make_budget(400 * 10**6, 1, 2, "test"))
    assert err.value.minimum_memory_limit is None  # no memory lets it run: calibrate instead


def test_memory_binds_where_no_chunking_of_fewer_tasks_fits():
    """A new user's median of 2 fields of 600 MB, lat and lon whole, on 1 thread: 2 tasks at
    100% of the budget read "parallelism: ... memory is not the limit"."""
    specs = (DimSpec("time", 2), DimSpec("y", 1000, DimRole.WHOLE))
    problem = PlanProblem("op", specs, linear_peak(4.0), seconds_per_element=1e-8)
    plan = plan_chunks(problem, budget(4 * 1000, threads=2))  # one field per task, no more
    assert plan.n_chunks == 2
    assert plan.binding == Binding.MEMORY
    roomy = plan_chunks(problem, budget(4 * 2000, threads=2))  # both fields in one task fit
    assert roomy.n_chunks == 2 and roomy.binding == Binding.PARALLELISM


def test_planned_chunks_are_regular_where_the_count_and_the_longest_stay():
    from xarray_memchunk.planning.search import _chunks_of

    assert _chunks_of(DimSpec("time", 2192), 36, 1) == (61,) * 35 + (57,)
    assert _chunks_of(DimSpec("x", 200), 2, 1) == (100, 100)
    assert _chunks_of(DimSpec("x", 1000), 3, 100) == (400, 400, 200)  # whole storage chunks
    # 11 chunks of at most 10 cannot be regular (ten make 100): balanced
    assert _chunks_of(DimSpec("x", 100), 11, 1) == (10,) + (9,) * 10
    # a last chunk shorter than a halo's depth is not allowed: balanced
    halo = DimSpec("x", 10, DimRole.HALO, depth=2)
    assert halo.shortest_chunk == 2 and _chunks_of(halo, 4, 1) == (3, 3, 2, 2)


def test_a_plan_with_every_dim_whole_says_so():
    """A new user's trial: a median over every dim, planned at exactly its minimum (100% of
    the budget), read "per-task overhead: fewer, larger chunks are faster and fit"."""
    specs = (DimSpec("y", 100, DimRole.WHOLE), DimSpec("x", 100, DimRole.WHOLE))
    problem = PlanProblem("op", specs, linear_peak(4.0), seconds_per_element=1e-8)
    assert plan_chunks(problem, budget(4 * 100 * 100, threads=2)).binding == Binding.WHOLE_DIMS
    free = PlanProblem("op", (DimSpec("x", 10),), linear_peak(4.0))
    assert plan_chunks(free, budget(10**9, threads=4)).binding == Binding.TASK_OVERHEAD


def test_a_regular_layout_that_would_be_the_source_chunks_unpriced_stays_balanced():
    """Review: an element-wise candidate is priced as cutting the source chunks; laid out as
    those very chunks, Dask would skip the rechunk and fuse the operator into the task that
    makes each chunk, which that candidate's footprint does not count."""
    from xarray_memchunk.planning.search import _chunks_of

    source = DimSpec("time", 2192, storage_chunk=61)
    assert _chunks_of(source, 36, 1) == (61,) * 32 + (60,) * 4  # priced as a rechunk: balanced
    assert _chunks_of(source, 36, 61) == (61,) * 35 + (57,)  # whole source chunks: as priced
    assert _chunks_of(DimSpec("time", 2192, storage_chunk=100), 36, 1) == (61,) * 35 + (57,)


def test_a_variable_s_measured_range_caps_its_own_dims_not_the_others():
    """A review's plain open_mfdataset: lat_bnds(time, lat, bnds), measured whole (its range
    394,200 elements), capped tas(time, lat, lon)'s chunks too: 90 tasks where 30 fit."""
    specs = (
        DimSpec("time", 1000, DimRole.FREE),
        DimSpec("lat", 100, DimRole.FREE),
        DimSpec("lon", 100, DimRole.FREE),
        DimSpec("bnds", 2, DimRole.WHOLE),
    )
    caps = ((("time", "lat", "bnds"), 1000 * 100 * 2.0), (("time", "lat", "lon"), 2.5e6))
    problem = PlanProblem("op", specs, linear_peak(10.0), task_element_caps=caps)
    plan = plan_chunks(problem, budget(10**9, threads=1))
    tas_elements = math.prod(max(plan.dask_chunks[d]) for d in ("time", "lat", "lon"))
    assert 2e5 < tas_elements <= 2.5e6  # tas's own range: lat_bnds's is over its own dims
    # as one cap over every dim, the smaller range held tas to tasks of 200,000 elements
    one = PlanProblem("op", specs, linear_peak(10.0), max_task_elements=2e5)
    held = plan_chunks(one, budget(10**9, threads=1))
    assert math.prod(max(c) for c in held.dask_chunks.values()) <= 2e5
    assert held.n_chunks > 2 * plan.n_chunks


def test_chunks_of_your_own_beyond_the_measured_range_say_the_prediction_extrapolates():
    """A review's whole-array chunk of 17,739,000 elements: the note said 'plans stay within'
    a range of 16,836,720, and nothing said this one did not."""
    specs = tuple(DimSpec(n, 200, DimRole.FREE) for n in "xyz")
    ranged = PlanProblem("op", specs, linear_peak(100.0), max_task_elements=200**3 / 4)
    beyond = plan_for_chunks(ranged, budget(10**12), {n: (200,) for n in "xyz"})
    (note,) = [n for n in beyond.notes if "go beyond" in n]
    assert "8,000,000 elements, measured up to 2,000,000" in note and "extrapolates" in note
    within = plan_for_chunks(ranged, budget(10**12), {n: (100, 100) for n in "xyz"})
    assert not [n for n in within.notes if "go beyond" in n]


def test_each_variable_s_work_is_counted_over_its_own_dims():
    """The second review's lat_bnds(time, lat, bnds): its seconds per element (high, measured
    on a small array) times tas's elements over every dim made a groupby of tas and lat_bnds
    look 7x as long, and the plan cut lon into 60 chunks where 12 ran alike."""
    specs = (
        DimSpec("time", 1000, DimRole.WHOLE),
        DimSpec("lat", 100, DimRole.FREE),
        DimSpec("lon", 100, DimRole.FREE),
        DimSpec("bnds", 2, DimRole.WHOLE),
    )
    terms = ((("time", "lat", "lon"), 1e-8), (("time", "lat", "bnds"), 1e-6))
    chunks = {"time": (1000,), "lat": (100,), "lon": (50, 50), "bnds": (2,)}
    common = {"task_overhead_s": 0, "read_seconds_per_element": 0}
    each = PlanProblem("op", specs, linear_peak(4.0), work_terms=terms, **common)
    one = PlanProblem("op", specs, linear_peak(4.0), seconds_per_element=1e-6, **common)
    per_task = 1e-8 * 1000 * 100 * 50 + 1e-6 * 1000 * 100 * 2  # tas 0.05 s + lat_bnds 0.2 s
    as_one = 1e-6 * 1000 * 100 * 50 * 2  # the larger rate over every dim: 10 s
    seconds = [plan_for_chunks(p, budget(10**9, threads=1), chunks) for p in (each, one)]
    ratio = seconds[1].estimated_seconds / seconds[0].estimated_seconds
    assert ratio == pytest.approx(as_one / per_task)  # the same waves of tasks
