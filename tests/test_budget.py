import math
import os
import re
import subprocess
import sys
import warnings
from dataclasses import replace
from types import SimpleNamespace

import dask
import dask.array
import dask.system
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk import Budget, BudgetError, MemoryBudgetWarning, resolve_budget, units
from xarray_memchunk.clusters import WorkerLayout, cluster_facts, spec_workers
from xarray_memchunk.datasets import synthetic_climate
from xarray_memchunk.memory_limits import machine_cores, make_budget
from xarray_memchunk.planning.budget import (
    IN_PROCESS_BASELINE,
    MEASURED_BASELINE,
    per_task_bytes,
    tightest_worker,
    with_baseline,
)
from xarray_memchunk.units import to_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.5GB", 1_500_000_000),
        ("1.5GiB", int(1.5 * 2**30)),
        ("512MiB", 512 * 2**20),
        (2_000_000, 2_000_000),
        (3.0e9, 3_000_000_000),
    ],
)
def test_sizes_parse_as_dask_does(text, expected):
    assert to_bytes(text) == expected


@pytest.mark.parametrize("bad", ["lots", "", "1.5 parsecs", 0, -5, "-1GB", None, True, [1]])
def test_bad_budgets_raise_budget_error(bad):
    with pytest.raises(BudgetError):
        to_bytes(bad)


def test_budget_argument_formula():
    with dask.config.set(
        {
            "memchunk.worker-baseline": "200MB",
            "memchunk.reserve": 0.1,
            "distributed.worker.memory.pause": 0.8,
        }
    ):
        budget = resolve_budget("1.5GB")
    assert budget.source.startswith("argument")
    assert budget.worker_memory == 1_500_000_000
    assert budget.per_task == int((0.8 * 1.5e9 - 200e6) * (1 - 0.1) / budget.threads_per_worker)
    assert budget.per_task < 0.8 * budget.worker_memory / budget.threads_per_worker
    assert "per-task budget" in budget.explain() and "argument" in budget.explain()


def test_a_memory_limit_without_a_cluster_is_shared_by_the_threaded_scheduler_s_threads():
    """A new user planned a function with memory_limit="1GB" and no cluster: planned for
    workers of one thread, Dask's threaded scheduler ran 2 tasks of 395.77 MiB at once in one
    process, which peaked at 1023 MiB. Now the limit is that process's, shared by its threads
    (dask config num_workers, else one per CPU)."""
    with dask.config.set({"num_workers": 3, "memchunk.worker-baseline": "200MB"}):
        budget = resolve_budget("1GB")
    assert (budget.n_workers, budget.threads_per_worker) == (1, 3)
    assert budget.per_task == int((0.8 * 1e9 - 200e6) * (1 - 0.1) / 3)
    assert "threaded scheduler runs 3 task(s) at once" in budget.explain()
    with dask.config.set({"num_workers": None}):  # Dask's count: affinity, cgroup quota
        assert resolve_budget("1GB").threads_per_worker == dask.system.CPU_COUNT
    for wrong in (0, -1, "four", 2.5):
        with dask.config.set({"num_workers": wrong}), pytest.raises(BudgetError, match="num_w"):
            resolve_budget("1GB")


def test_a_plan_without_a_cluster_fits_all_the_threads_tasks_in_the_limit():
    """The conftest pins one thread; with two, each of the two tasks that run at once in this
    process gets its share of the limit, and the plan fits it."""
    data = synthetic_climate(400, 100, 103, chunks={"time": 10})
    plans = {}
    for threads in (1, 2):
        with dask.config.set(num_workers=threads):
            plans[threads] = data.memchunk.plan("median", dim="time", memory_limit="600MB")
    one, two = plans[1], plans[2]
    assert (two.budget.threads_per_worker, two.budget.n_workers) == (2, 1)
    assert (
        two.budget.per_task == one.budget.per_task // 2
        or abs(2 * two.budget.per_task - one.budget.per_task) <= 1
    )
    assert two.predicted_peak_bytes <= two.budget.per_task
    assert two.n_chunks >= 2  # both threads busy


NUMPY_MEDIAN_SCRIPT = """
import resource, sys
import numpy as np, xarray as xr, dask
import xarray_memchunk as xm

limit = sys.argv[1]
dask.config.set(num_workers=2)  # as on this project's 2 cores, whatever the machine's
a = np.random.default_rng(0).standard_normal((1000, 300, 600), dtype=np.float32)  # 687 MiB
da = xr.DataArray(a, dims=("time", "lat", "lon"), name="tas")
try:
    plan = da.memchunk.plan("median", dim="time", memory_limit=limit)
except xm.BudgetError as err:
    print("refused:", err)
    raise SystemExit(0)
plan.apply().compute()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("ratio", peak / dask.utils.parse_bytes(limit))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in kiB on Linux only")
@pytest.mark.parametrize("limit", ["1GB", "1.3GB"])
def test_a_plan_without_a_cluster_counts_the_arrays_this_process_holds(limit, tmp_path):
    """A new user's median of a 687 MiB NumPy array at 1 GB, no cluster: planned with the
    configured baseline (190.73 MiB), the process held 803 MiB before planning and peaked at
    868 MiB, 0.91 of the limit. Now its baseline is what the process holds: refused at 1 GB,
    and at 1.3 GB the peak is under the 0.8 x limit the plan keeps to (0.70 here)."""
    script = tmp_path / "numpy_median.py"
    script.write_text(NUMPY_MEDIAN_SCRIPT)
    run = subprocess.run(
        [sys.executable, str(script), limit], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    if limit == "1GB":
        assert "refused:" in run.stdout and "this process already holds" in run.stdout
        assert "your own arrays included" in run.stdout
    else:
        ratio = float(run.stdout.split("ratio")[-1])
        assert ratio < 0.8, run.stdout


def test_a_held_process_raises_the_threaded_baseline(monkeypatch):
    from xarray_memchunk import memory_limits

    monkeypatch.setattr(memory_limits, "this_process_memory", lambda: 700 * 2**20)
    budget = resolve_budget("2GB")
    assert budget.worker_baseline == 700 * 2**20
    assert budget.baseline_source.startswith("this Python process's memory now")


def test_a_refusal_with_no_cluster_states_a_minimum_that_plans_after_planning_grew_it(
    monkeypatch,
):
    """A trial: a median over ``open_mfdataset`` files refused with "at least 276.01 MiB", and
    refused again there: opening and measuring the files had raised this process's memory,
    which is the baseline with no cluster. Here planning raises it by 40 MB, then by 5 MB."""
    from xarray_memchunk import memory_limits
    from xarray_memchunk.operators.staged_plan import STAGING_KEPT_POWER, STAGING_KEPT_SCALE

    held = iter([300_000_000])  # the first read; planning grows it by 40 MB after
    now = [340_000_000]
    monkeypatch.setattr(memory_limits, "this_process_memory", lambda: next(held, now[0]))
    tas = synthetic_climate(365, 30, 40, chunks={"time": 30}).tas
    with pytest.raises((BudgetError, xm.InfeasiblePlanError)) as refused:
        tas.memchunk.plan("median", dim="time", memory_limit="300MB")
    least = refused.value.minimum_memory_limit
    assert least is not None
    # the figures it gives on its way are the one it leads with, its allowance included
    figures = set(re.findall(r"at least (\S+ \S+) \(memory_limit\)", str(refused.value)))
    assert figures == {units.format_size_up(least)}, figures
    now[0] += 5_000_000  # what the next plan's own work may add, within the allowance
    plan = tas.memchunk.plan("median", dim="time", memory_limit=least)
    # this process's memory now, and (staged) what writing the 13 source chunks leaves in it
    staged = any("temporary Zarr store" in n for n in plan.notes)
    kept = STAGING_KEPT_SCALE * 13**STAGING_KEPT_POWER if staged else 0
    assert plan.fits
    assert plan.budget.worker_baseline == pytest.approx(now[0] + kept, abs=2**10)


def test_with_no_cluster_a_plan_counts_what_planning_left_in_this_process(monkeypatch):
    """A user's groupby function over open_mfdataset files, planned with no cluster at
    411.54 MiB, counted the configured 190.73 MiB (the process held 155.5 MiB), and its sample
    run left the process holding 219.3 MiB: the run peaked at 360.4 MiB against a 329.23 MiB
    line. Here planning raises this process's memory from 150 MB to 250 MB."""
    from xarray_memchunk import memory_limits

    held = iter([150_000_000, 150_000_000])  # read before planning, and by its budget
    monkeypatch.setattr(memory_limits, "this_process_memory", lambda: next(held, 250_000_000))
    tas = synthetic_climate(365, 30, 40, chunks={"time": 30}).tas
    plan = tas.memchunk.plan("median", dim="time", memory_limit="600MB")
    assert plan.budget.worker_baseline == 250_000_000
    assert plan.budget.baseline_source.startswith("this Python process's memory now")


@pytest.mark.cluster
def test_on_a_cluster_a_plan_counts_what_planning_left_in_the_workers(
    monkeypatch, quiet_distributed
):
    """A trial's groupby over a preprocessing graph on fresh workers tried map-reduce first,
    whose first run imported flox's kernels in each worker (94 MiB); the blockwise plan it
    chose counted the workers' memory from before (198.55 MiB where they held 240 MiB), and
    its run at the stated minimum peaked at 633 MiB against a 562 MiB pause line. Here
    planning leaves 120 MiB in every worker."""
    from distributed import Client, LocalCluster

    from xarray_memchunk import api

    original = api._prepare
    grown = []

    def grows_the_workers(*args, **kwargs):
        prepared = original(*args, **kwargs)
        if not grown:
            client.run(_hold, 120 * 2**20)
            grown.append(max(client.run(_rss).values()))
        return prepared

    monkeypatch.setattr(api, "_prepare", grows_the_workers)
    tas = synthetic_climate(365, 30, 40, chunks={"time": 30}).tas
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="1.5GB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        plan = tas.memchunk.plan("median", dim="time")
    assert grown
    assert plan.budget.worker_baseline >= grown[0] - 8 * 2**20
    assert plan.budget.baseline_source.startswith("the largest worker's process memory now")


def _hold(nbytes, dask_worker=None):
    import numpy as np

    dask_worker.memchunk_test_held = np.ones(nbytes, dtype=np.uint8)  # touched


def _rss():
    import psutil

    return psutil.Process().memory_info().rss


@pytest.mark.parametrize(
    ("held", "loaded", "counted"), [(300, True, False), (300, False, True), (100, True, True)]
)
def test_with_no_cluster_a_runtime_loaded_here_is_counted_once(monkeypatch, held, loaded, counted):
    """A new user's second GST3D plan in one process, after the first had run, needed 750 MB
    where the first had needed 530 MB: this process's memory, the baseline, held the compiled
    kernel, and the plan counted it again. It is counted where the baseline does not hold it:
    the kernel not loaded, or a process holding less than the configured baseline."""
    from xarray_memchunk import memory_limits
    from xarray_memchunk.operators.gst3d import fused

    monkeypatch.setattr(memory_limits, "this_process_memory", lambda: held * 2**20)
    monkeypatch.setattr(fused, "kernel_loaded", lambda: loaded)
    volume = xr.DataArray(
        np.zeros((64, 64, 64), dtype="float32"), dims=("inline", "crossline", "sample")
    )
    with dask.config.set(num_workers=2):
        plan = volume.memchunk.plan("gst3d", memory_limit="2GB")
    assert (plan.runtime_bytes > 0) is counted
    assert any("loaded in this process already" in n for n in plan.notes) is not counted


@pytest.mark.cluster
@pytest.mark.parametrize("adaptive", [False, True])
def test_a_plan_after_a_run_counts_the_workers_compiled_code_once(adaptive, cluster_client):
    """A new user's second GST3D plan after a first run counted the compiled kernel twice: in
    the worker's memory, the baseline (252 MiB on 1 worker x 4 threads), and again per task.
    Loaded in every worker of a fixed cluster, it is counted in their memory alone: the second
    plan needs what the first did. Where workers may join (adaptive), a new one loads it with
    its first task, where it stays counted."""
    from xarray_memchunk.datasets import synthetic_seismic

    make, Client = cluster_client
    volume = synthetic_seismic((64, 64, 64)).amplitude
    with make("1.5GB", n_workers=1, threads_per_worker=2) as cluster, Client(cluster):
        if adaptive:
            cluster.adapt(minimum=1, maximum=1)
        first = volume.memchunk.plan("gst3d")
        first.apply().sum().compute()
        second = volume.memchunk.plan("gst3d")
    assert first.runtime_bytes > 0
    loaded = any("loaded in every worker already" in note for note in second.notes)
    if adaptive:
        assert second.runtime_bytes == first.runtime_bytes and not loaded
        return
    assert second.runtime_bytes == 0 and loaded
    threads = first.budget.threads_per_worker
    need = [p.budget.worker_baseline + threads * p.predicted_peak_bytes for p in (first, second)]
    assert need[1] <= need[0] + 8 * 2**20, [n / 2**20 for n in need]


def test_per_task_shrinks_with_threads():
    one = per_task_bytes(
        4_000_000_000, 1, worker_baseline=200_000_000, reserve=0.1, pause_fraction=0.8
    )
    four = per_task_bytes(
        4_000_000_000, 4, worker_baseline=200_000_000, reserve=0.1, pause_fraction=0.8
    )
    assert four == one // 4 or abs(four - one / 4) < 1


def test_budget_from_dask_config():
    with dask.config.set({"memchunk.worker-memory": "3GB", "memchunk.threads-per-worker": 2}):
        budget = resolve_budget()
    assert budget.worker_memory == 3_000_000_000
    assert budget.threads_per_worker == 2
    assert "memchunk.worker-memory" in budget.source


def test_budget_from_system_memory():
    budget = resolve_budget()
    assert budget.source.startswith("system memory")
    assert 0 < budget.per_task < budget.worker_memory


def test_budget_object_passes_through():
    b = Budget(worker_memory=10, threads_per_worker=1, n_workers=1, per_task=5, source="mine")
    assert resolve_budget(b) is b


def test_threads_compute_on_no_more_cores_than_they_share():
    def layout(cores: int, device: str = "cpu") -> Budget:
        return Budget(2**30, 4, 3, 2**27, "test", device=device, cores=cores)

    # memory counts every thread's task; time, the cores those threads share
    assert layout(2).total_threads == 12 and layout(2).compute_slots == 2
    assert layout(0).compute_slots == 12  # not known: a core per thread
    assert layout(64).compute_slots == 12
    assert layout(2, device="gpu").compute_slots == 3  # a GPU computes one task at a time
    assert layout(2).explain().endswith("3 workers x 4 threads on 2 cores")
    assert layout(0).explain().endswith("3 workers x 4 threads")
    assert resolve_budget("1GB").cores == machine_cores()  # the threaded scheduler: here
    assert 1 <= machine_cores() <= (os.cpu_count() or 1)


@pytest.mark.cluster
def test_budget_from_distributed_client(cluster_client):
    """Workers in their own processes (in this one, see test_deployments: each pauses on all
    that this test process holds, which grows over a run of the suite)."""
    make, Client = cluster_client
    with make("700MB", threads_per_worker=2) as cluster, Client(cluster):
        budget = resolve_budget()
        explicit = resolve_budget("500MB")
        with pytest.warns(MemoryBudgetWarning, match=r"memory_limit='2GB' is more.*667\.57 MiB"):
            more = resolve_budget("2GB")
    assert budget.worker_memory == 700_000_000
    assert budget.threads_per_worker == 2
    assert budget.n_workers == 2 and budget.total_threads == 4
    assert "run in this process" not in budget.source
    # the workers run on this machine: they compute on no more cores than it gives them
    assert budget.cores == explicit.cores == machine_cores()
    assert budget.compute_slots == min(4, machine_cores())
    assert budget.source.startswith("distributed client tcp://")
    # a smaller explicit budget is honoured, with the cluster's thread layout
    assert explicit.source == "argument" and explicit.threads_per_worker == 2
    assert explicit.worker_memory == 500_000_000
    # a larger one would pause and kill the 700 MB workers: theirs is used
    assert more.worker_memory == 700_000_000 and more.per_task == budget.per_task
    assert "less than memory_limit='2GB'" in more.source


@pytest.mark.parametrize("measured", [True, False])
def test_no_room_names_memory_left_from_earlier_work(measured):
    """Workers that already hold more than the pause line: a restart is named when measured."""
    with pytest.raises(BudgetError) as err:
        make_budget(
            1_000_000_000,
            1,
            2,
            "test",
            worker_baseline=850_000_000,
            baseline_source=MEASURED_BASELINE if measured else "",
        )
    assert "has no room for a task" in str(err.value)
    assert ("client.restart()" in str(err.value)) is measured


def test_a_restart_is_not_named_where_the_operators_own_figure_raised_the_baseline():
    """A refusal planned again after planning's first runs grew the workers advised "free the
    283.96 MiB a worker process holds now from earlier work: client.restart()": flox's kernels,
    which a fresh worker imports again on its first task."""
    from xarray_memchunk.planning.budget import held_memory_remedy

    raised = f"{MEASURED_BASELINE}, and a worker's memory once it has run 'groupby'"
    assert held_memory_remedy(300 * 2**20, raised) == ""
    assert "client.restart()" in held_memory_remedy(300 * 2**20, MEASURED_BASELINE)


def test_tightest_worker_is_not_always_the_smallest_memory():
    """1 GB x 1 thread leaves a task 540 MB; 2 GB x 4 threads leaves one 315 MB."""
    terms = {"worker_baseline": 200_000_000, "pause_fraction": 0.8}
    small, wide = (1_000_000_000, 1), (2_000_000_000, 4)
    assert tightest_worker([small, wide], **terms) == wide
    assert tightest_worker([(2_000_000_000, 1), (1_000_000_000, 2)], **terms) == (
        1_000_000_000,
        2,
    )


def _spec_cluster(worker_spec=None, new_spec=None, maximum=None, minimum=0):
    """An object shaped as a ``SpecCluster`` is, as far as :func:`spec_workers` reads one."""
    adaptive = None if maximum is None else SimpleNamespace(maximum=maximum, minimum=minimum)
    return SimpleNamespace(worker_spec=worker_spec or {}, new_spec=new_spec, _adaptive=adaptive)


def test_spec_workers_of_an_adaptive_local_cluster():
    spec = {"cls": "Nanny", "options": {"memory_limit": "1GB", "nthreads": 2}}
    layouts, how = spec_workers(_spec_cluster(new_spec=spec, maximum=3))
    assert layouts == [WorkerLayout(1_000_000_000, 2)] * 3
    assert "the adaptive cluster's worker spec" in how and "3 worker(s)" in how
    # no maximum: as many workers as its minimum, or one
    layouts, how = spec_workers(_spec_cluster(new_spec=spec, maximum=math.inf))
    assert len(layouts) == 1 and "no adaptive maximum" in how


def test_spec_workers_of_a_job_queue():
    """dask-jobqueue's spec: a job's cores and memory, shared by its processes (its group)."""
    job = {"cls": "SLURMJob", "options": {"cores": 8, "memory": "16GB", "processes": 2}}
    job["group"] = ["-0", "-1"]
    layouts, _ = spec_workers(_spec_cluster(worker_spec={"job-0": job}))
    assert layouts == [WorkerLayout(8_000_000_000, 4)] * 2


def test_workers_that_run_in_this_process_are_one_worker_of_their_threads():
    """Workers started here (``processes=False``) each pause on all this process holds.

    A mixed spec keeps its ``Nanny`` worker apart; a ``cls`` given by name is imported, as
    ``SpecCluster`` does; a job class runs elsewhere.
    """
    import psutil

    def entry(cls, limit):
        return {"cls": cls, "options": {"memory_limit": limit, "nthreads": 2}}

    specs = {
        "a": entry("distributed.Worker", "1GB"),
        "b": entry("distributed.Worker", "2GB"),
        "c": entry("distributed.Nanny", "4GB"),
        "d": entry("SLURMJob", "8GB"),
    }
    client = SimpleNamespace(
        scheduler_info=lambda n_workers: {"address": "tcp://scheduler", "workers": {}},
        cluster=_spec_cluster(worker_spec=specs),
    )
    held = psutil.Process().memory_info().rss
    facts = cluster_facts(client)
    assert sorted(facts.workers) == sorted(
        [
            WorkerLayout(1_000_000_000, 4),  # a and b: one of 4 threads, the smaller limit
            WorkerLayout(4_000_000_000, 2),
            WorkerLayout(8_000_000_000, 2),
        ]
    )
    assert facts.in_this_process and facts.largest_process_memory >= held
    assert "its 2 workers run in this process" in facts.source
    nanny_only = SimpleNamespace(
        scheduler_info=client.scheduler_info,
        cluster=_spec_cluster(worker_spec={"c": specs["c"]}),
    )
    assert not cluster_facts(nanny_only).in_this_process


def test_spec_workers_without_a_spec_cluster():
    assert spec_workers(None) is None  # a client connected to a scheduler's address
    assert spec_workers(_spec_cluster()) is None  # a spec that starts no worker


def test_a_stated_minimum_is_rounded_up():
    from xarray_memchunk.planning.budget import format_size, format_size_up

    assert format_size(0.9903e9) == "0.92 GiB"  # what the refusal said, too little
    assert format_size_up(0.9903e9) == "0.93 GiB"
    assert format_size_up(1.401 * 2**30) == "1.41 GiB"
    assert format_size_up(2 * 2**30) == "2.00 GiB"


_SIZE = r"([\d,.]+) (B|kiB|MiB|GiB|TiB)"
_FORMULA = re.compile(
    rf"per-task budget {_SIZE} = \(([\d.]+) pause threshold x {_SIZE} memory_limit - {_SIZE} "
    rf"worker baseline(?: \([^)]*\))?\) x \(1 - ([\d.]+) reserve\) / (\d+) threads? per worker"
)
_SCALE = {"B": 1, "kiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _printed_arithmetic(text):
    """The result and the terms of a budget's printed formula, as numbers in its one unit."""
    match = _FORMULA.search(text)
    assert match, text
    per, unit, pause, memory, memory_unit, baseline, baseline_unit, reserve, threads = (
        match.groups()
    )
    assert unit == memory_unit == baseline_unit, text  # one unit: checkable by hand
    number = lambda s: float(s.replace(",", ""))  # noqa: E731
    result = (number(pause) * number(memory) - number(baseline)) * (1 - number(reserve))
    return number(per), result / int(threads), _SCALE[unit]


@pytest.mark.parametrize(
    "budget",
    [
        make_budget(2 * 10**9, 1, 2, "argument", reserve=0.1, worker_baseline=200 * 10**6),
        # a LocalCluster(n_workers=2, threads_per_worker=2, memory_limit="2GB")-like layout
        make_budget(2 * 10**9, 2, 2, "distributed client", pause_fraction=0.8, reserve=0.1),
        make_budget(4 * 2**30, 4, 1, "with a reserve", reserve=0.25, pause_fraction=0.8),
        make_budget(
            10**9,
            1,
            2,
            "measured",
            worker_baseline=514 * 10**6,
            pause_fraction=0.8,
            baseline_source=MEASURED_BASELINE,
        ),
        make_budget(64 * 2**30, 32, 4, "large worker", reserve=0.1, pause_fraction=0.8),
        make_budget(3000, 1, 1, "tiny", reserve=0.0, pause_fraction=1.0, worker_baseline=0),
    ],
    ids=["argument", "2-threads", "reserve", "measured-baseline", "large", "bytes"],
)
def test_printed_budget_arithmetic_gives_the_printed_result(budget):
    """Issue 33: the formula printed, evaluated, gives the per-task budget printed."""
    text = budget.explain()
    printed, evaluated, scale = _printed_arithmetic(text)
    # each term is rounded to the hundredth of the unit; the result too
    assert abs(printed - evaluated) <= 0.011 if scale > 1 else abs(printed - evaluated) <= 1
    assert abs(printed * scale - budget.per_task) <= 0.005 * scale + 1
    assert f"{budget.threads_per_worker} thread" in text and "thread(s)" not in text


def test_a_hand_built_budget_is_not_explained_by_a_formula_it_does_not_follow():
    """Issue 33: Budget(per_task=...) by hand read "37.52 MiB = (1 x 0.93 GiB - 0 B) x 1 / 1"."""
    tight = Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=39_340_000, source="nb"
    )
    text = tight.explain()
    assert not tight.from_formula
    assert _FORMULA.search(text) is None and " = (" not in text
    assert text.startswith("per-task budget 37.52 MiB as given (source: nb)")
    assert "2 workers x 1 thread" in text
    # one that follows the formula, built by hand, is explained by it
    follows = Budget(
        worker_memory=10**9, threads_per_worker=1, n_workers=2, per_task=10**9, source="nb"
    )
    assert follows.from_formula and _printed_arithmetic(follows.explain())[0] == 0.93


def test_budgets_show_binary_units_and_the_limit_as_written():
    """Issue 33: one unit convention, Dask's (binary); a decimal limit is converted once."""
    decimal = resolve_budget("2GB").explain()
    assert "memory_limit 2 GB = " in decimal
    rest = decimal.replace("memory_limit 2 GB", "")
    assert not re.search(r"\d (kB|MB|GB|TB)\b", rest), decimal
    binary = resolve_budget("2GiB").explain()
    assert "2,048.00 MiB memory_limit" in binary or "2.00 GiB memory_limit" in binary
    assert " GB" not in binary and " MB" not in binary


def test_a_larger_baseline_gives_each_task_less_and_says_why():
    budget = make_budget(to_bytes("1GB"), 2, 1, "test")
    raised = with_baseline(budget, budget.worker_baseline + 50 * 2**20, "what f leaves")
    expected = per_task_bytes(
        budget.worker_memory,
        2,
        worker_baseline=budget.worker_baseline + 50 * 2**20,
        reserve=budget.reserve,
        pause_fraction=budget.pause_fraction,
    )
    assert raised.per_task == expected < budget.per_task
    assert raised.baseline_source == "what f leaves" and "what f leaves" in raised.explain()
    assert with_baseline(budget, budget.worker_baseline - 1, "less") is budget
    given = Budget(to_bytes("1GB"), 1, 1, per_task=10**8, source="by hand")
    assert with_baseline(given, 10**9, "more") is given
    with pytest.raises(BudgetError, match="no room for a task"):
        with_baseline(budget, budget.worker_memory, "all of it")


def test_workers_in_this_process_need_room_for_a_run_beside_their_tasks():
    # 700 MB workers in a process holding 553 MB: a few MiB per task, and the
    # process passed the pause line once the plan was submitted (a run that hung, paused)
    from xarray_memchunk.planning.budget import IN_PROCESS_BASELINE, MIN_TASK_BYTES

    args = (700_000_000, 2, 1, "test")
    with pytest.raises(BudgetError, match=r"leaves 3\.00 MiB per task, under the 16\.00 MiB"):
        make_budget(
            *args,
            worker_baseline=553_000_000,
            baseline_source=IN_PROCESS_BASELINE,
            in_this_process=True,
        )
    # worker processes of their own hold no graph: the same numbers are planned for
    assert make_budget(*args, worker_baseline=553_000_000).per_task < MIN_TASK_BYTES
    # the memory the error asks for leaves the minimum
    roomy = make_budget(
        756_000_000,
        2,
        1,
        "test",
        worker_baseline=553_000_000,
        baseline_source=IN_PROCESS_BASELINE,
        in_this_process=True,
    )
    assert roomy.per_task >= MIN_TASK_BYTES


def test_a_larger_baseline_for_workers_in_this_process_keeps_their_minimum():
    from xarray_memchunk.planning.budget import MIN_TASK_BYTES, with_baseline

    budget = make_budget(1_000_000_000, 2, 1, "test", in_this_process=True)
    assert budget.per_task >= MIN_TASK_BYTES
    with pytest.raises(BudgetError, match=r"under the 16\.00 MiB"):
        with_baseline(budget, 780_000_000, "held after running")
    # workers in processes of their own: the same baseline leaves a small budget, as before
    own = make_budget(1_000_000_000, 2, 1, "test")
    assert 0 < with_baseline(own, 780_000_000, "held after running").per_task < MIN_TASK_BYTES


def test_a_worker_memory_reported_before_its_tasks_freed_it_is_asked_again():
    """A heartbeat just after a median said 361 MiB of a worker that held 137 MiB again."""
    workers = {
        "tcp://a": {"memory_limit": 10**9, "nthreads": 1, "metrics": {"memory": 379_000_000}},
        "tcp://b": {"memory_limit": 10**9, "nthreads": 1, "metrics": {"memory": 150_000_000}},
    }
    asked = []

    def run(function, workers, on_error):
        asked.append(workers)
        return {address: 144_000_000 for address in workers}

    def info(n_workers):
        return {"address": "tcp://scheduler", "workers": workers}

    client = SimpleNamespace(scheduler_info=info, run=run)
    assert cluster_facts(client, 200_000_000).largest_process_memory == 144_000_000
    assert asked == [["tcp://a", "tcp://b"]]  # all of them, once one reported more
    assert cluster_facts(client, 400_000_000).largest_process_memory == 379_000_000
    assert cluster_facts(client).largest_process_memory == 379_000_000
    assert len(asked) == 1  # under the threshold, or none given: the heartbeats' figures

    def cannot_run(function, workers, on_error):
        raise OSError("no connection")

    stale = SimpleNamespace(scheduler_info=info, run=cannot_run)
    assert cluster_facts(stale, 200_000_000).largest_process_memory == 379_000_000
    from xarray_memchunk import memory_limits

    # planning asks above memchunk.worker-baseline
    budget = memory_limits._cpu_budget(None, client)
    assert budget.worker_baseline == to_bytes("200MB") and len(asked) == 2


def test_a_memory_limit_in_bytes_too_small_for_a_worker_says_a_bare_number_is_bytes():
    """A new user's trial: memory_limit=1.5 (meant as gigabytes) was read as 1.5 bytes."""
    with pytest.raises(
        BudgetError, match=r"a number without a unit is bytes: write e\.g\. '1\.5GB'"
    ):
        make_budget(1.5, 1, 2, "argument")
    with pytest.raises(BudgetError) as err:
        make_budget(100_000_000, 1, 2, "argument")  # 100 MB: too small, but meant as bytes
    assert "without a unit" not in str(err.value)


@pytest.mark.parametrize(("threads", "in_this_process"), [(1, True), (3, True), (2, False)])
def test_no_room_for_a_task_gives_the_stated_limit_as_a_number(threads, in_this_process):
    """The refusal's ``minimum_memory_limit`` plans at that limit, and not at 0.99 of it."""
    terms = {
        "worker_baseline": 553_000_000,
        "in_this_process": in_this_process,
        "baseline_source": IN_PROCESS_BASELINE if in_this_process else MEASURED_BASELINE,
    }
    with pytest.raises(BudgetError) as err:
        make_budget(600_000_000, threads, 2, "test", **terms)
    least = err.value.minimum_memory_limit
    assert least is not None and units.format_size_up(least) in str(err.value)
    assert make_budget(least, threads, 2, "test", **terms).per_task > 0
    with pytest.raises(BudgetError):
        make_budget(int(0.99 * least), threads, 2, "test", **terms)


def test_a_budget_that_cannot_be_read_states_no_limit():
    with pytest.raises(BudgetError) as err:
        resolve_budget(memory_limit="1.5 gigs")
    assert err.value.minimum_memory_limit is None


def test_no_room_for_a_task_states_what_the_operator_needs_beyond_it():
    """A trial: "at least 238.42 MiB", where the median was then refused again, for more."""
    from xarray_memchunk.datasets import synthetic_climate

    ds = synthetic_climate(365, 30, 40, chunks={"time": 30})
    with pytest.raises(
        BudgetError,
        match=r"no room for a task: .*\. Give this process at least .*: .median. needs more",
    ) as err:
        ds.memchunk.plan("median", dim="time", memory_limit="240MB")
    least = err.value.minimum_memory_limit
    assert least is not None and least > to_bytes("240MB")
    assert units.format_size_up(least) in str(err.value)
    # caught as a refusal too: a new user's `except InfeasiblePlanError` crashed on it
    assert isinstance(err.value, xm.InfeasiblePlanError)
    assert ds.memchunk.plan("median", dim="time", memory_limit=least).chunks["time"] == 365
    with pytest.raises((BudgetError, xm.InfeasiblePlanError)):
        ds.memchunk.plan("median", dim="time", memory_limit=int(0.99 * least))


@pytest.mark.parametrize(
    ("operator", "kwargs"),
    [("rolling", {"dim": "time", "window": 7}), ("groupby", {"by": "time.month"})],
)
def test_a_stated_minimum_plans_where_calibrating_raised_the_baseline(
    tmp_path, monkeypatch, operator, kwargs
):
    """A trial on ``open_mfdataset`` data: rolling, groupby and resample refused at 230 MB said
    "at least 238.42 MiB", and were refused there again, stating no minimum: calibrating them
    raised a worker's baseline (what their first run leaves in it) past its room."""
    from xarray_memchunk.datasets import synthetic_climate

    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path / "calibrations"))
    full = synthetic_climate(730, 30, 40)
    for year in (0, 1):
        full.isel(time=slice(365 * year, 365 * (year + 1))).to_netcdf(tmp_path / f"{year}.nc")
    ds = xr.open_mfdataset(sorted(tmp_path.glob("*.nc")), chunks={"time": 30})
    limit, stated = "230MB", []
    for _ in range(3):  # a function measured on its first plan states its own need on the next
        try:
            ds.tas.memchunk.plan(operator, memory_limit=limit, **kwargs)
            break
        except (BudgetError, xm.InfeasiblePlanError) as refused:
            limit = refused.minimum_memory_limit
            assert limit is not None, str(refused)
            stated.append(limit)
    assert 1 <= len(stated) <= 2, stated
    # 1% below is refused: the minimum is the least within what the baselines measured when
    # calibrating each method differ by (groupby's blockwise and map-reduce: 0.3 MiB apart)
    with pytest.raises((BudgetError, xm.InfeasiblePlanError)) as less:
        ds.tas.memchunk.plan(operator, memory_limit=int(0.99 * limit), **kwargs)
    assert less.value.minimum_memory_limit == pytest.approx(limit, rel=0.01)


def test_no_room_for_a_function_with_no_model_measures_it_only_as_asked_and_warns_nothing(
    tmp_path, monkeypatch
):
    """The refusal is tried at the least memory with room: the function is measured there
    where planning may measure (what its runs leave counts in the minimum), not otherwise."""
    import warnings

    import dask.array as da

    data = xm.BlockwiseOperator("no-room-fn", lambda block: block * 2)
    field = xr.DataArray(da.zeros((40, 30), chunks=(10, 30)), dims=("y", "x"), name="f")
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    for measure, files in (("never", 0), ("auto", 1)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(BudgetError, match="no room for a task"):
                field.memchunk.plan(data, memory_limit="150MB", measure=measure)
        assert not [w for w in caught if issubclass(w.category, MemoryBudgetWarning)]
        assert len(list(tmp_path.glob("*.json"))) == files  # measured as asked only
    with pytest.raises(BudgetError, match="no room for a task"), warnings.catch_warnings():
        warnings.simplefilter("error", MemoryBudgetWarning)
        field.memchunk.plan("mean", dim="y", memory_limit="150MB", chunks={"y": 40})


def test_a_result_too_large_to_gather_into_one_worker_is_said_so():
    """A new user's trial: a rolling mean of a 301 MiB Dataset on 2 x 2 threads x 800 MB (39%
    of a worker's limit) paused workers when computed, where the docs' "about half a worker's
    memory limit" said it would not; at 420 MB it ended in KilledWorker on Dask's
    ``finalize-`` task. Gathering holds the pieces and the whole beside the baseline."""
    budget = Budget(
        worker_memory=763 * 2**20,
        threads_per_worker=2,
        n_workers=2,
        per_task=100 * 2**20,
        source="test",
        worker_baseline=199 * 2**20,
        pause_fraction=0.8,
    )
    advice = budget.gather_advice(301 * 2**20)
    assert "gathers its 301.00 MiB into one worker" in advice
    assert "about 602.00 MiB" in advice and "610.40 MiB pause threshold" in advice
    assert "result.memchunk.to_zarr(path)" in advice
    # what fits beside the baseline under the pause threshold is not warned of
    assert budget.gather_advice(200 * 2**20) == ""
    assert budget.gather_advice(206 * 2**20) != ""  # 2 x 206 + 199 > 610.4
    advice = budget.gather_advice(301 * 2**20, "deptho")
    assert "each of its variables into one worker in turn, the largest ('deptho') " in advice


def test_a_dataset_is_gathered_a_dask_variable_at_a_time():
    """Dask gathers each variable of a Dataset by its own ``finalize-`` task (measured: two
    95 MiB variables, two finalize tasks of 95 MiB); NumPy-backed ones never reach a worker."""
    from xarray_memchunk.api import _gathered

    ds = xr.Dataset(
        {
            "a": ("x", dask.array.zeros(1000, chunks=100)),
            "b": ("x", dask.array.zeros(1000, dtype="f4", chunks=100)),
            "big": ("y", np.zeros(10**5)),
        }
    )
    assert _gathered(ds) == (8000, "a")
    assert _gathered(ds.a) == (8000, "")
    assert _gathered(ds.big) == (0, "")
    assert _gathered(ds[["big"]]) == (0, "")


def test_with_no_cluster_the_pieces_of_a_result_wait_beside_the_running_tasks():
    """A new user's stencil on a 30.52 MiB volume, computed with no cluster at its stated
    minimum: 2 tasks of 74 MB predicted beside a 230 MiB baseline, under the pause line; the
    finished pieces of the result waited beside them, and the process peaked at 0.77-0.84 of
    its limit. The pieces and the whole (61 MiB) alone would fit."""
    budget = Budget(
        worker_memory=507 * 10**6,
        threads_per_worker=2,
        n_workers=1,
        per_task=74 * 10**6,
        source="test",
        worker_baseline=230 * 2**20,
        pause_fraction=0.8,
        threaded_scheduler=True,
    )
    result = 200**3 * 4
    assert budget.gather_advice(result) == ""  # the last task alone fits
    advice = budget.gather_advice(result, running=2 * 74 * 10**6)
    assert "into this process" in advice and "wait beside the tasks still running" in advice
    assert "up to 30.52 MiB" in advice and "result.memchunk.to_zarr(path)" in advice
    assert budget.gather_advice(0, running=10**9) == ""  # no result: nothing gathered
    # a Dataset's variables' pieces all wait: 3 of them are more than this process has room for
    assert budget.gather_advice(result // 4, running=2 * 74 * 10**6) == ""
    assert budget.gather_advice(result // 4, running=2 * 74 * 10**6, pieces=3 * result) != ""
    # on a cluster of 4 workers, each holds its share of the pieces
    on_four = replace(budget, threaded_scheduler=False, n_workers=4)
    assert on_four.gather_advice(result, running=2 * 74 * 10**6) == ""


@pytest.mark.cluster
def test_computing_a_result_too_large_to_gather_warns_and_the_report_says_so(
    cluster_client, monkeypatch, tmp_path
):
    """Warned at apply, every write of a large result came after a warning that said it did
    not apply then: it is given where the result is computed in one piece, once."""
    from xarray_memchunk.measure.runs import RunReport

    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    make, Client = cluster_client
    cube = synthetic_climate(1460, 90, 180, chunks={"time": 73})  # 95 MB float32: x2 too much
    with make("400MB") as cluster, Client(cluster):
        gathered = r"variables into one worker in turn, the largest \('tas'\) 90\.2\d MiB"
        with warnings.catch_warnings():
            warnings.simplefilter("error", xm.ResultGatherWarning)
            plan = cube.memchunk.plan("rolling", dim="time", window=5)
            result = plan.apply()  # it may be written
            result.memchunk.to_zarr(tmp_path / "rolled.zarr")  # nothing gathered
        with pytest.warns(xm.ResultGatherWarning, match=gathered) as caught:
            dask.optimize(result)  # as computing it does, without gathering it here
            dask.optimize(result.tas.data)
        assert len(caught) == 1  # once for the result
        assert caught[0].filename == __file__  # the caller's line, not Dask's or memchunk's
        assert not issubclass(xm.ResultGatherWarning, xm.MemoryBudgetWarning)
        assert plan.runs[-1].gather.startswith("computing the result in one piece")
        with warnings.catch_warnings():
            warnings.simplefilter("error", xm.ResultGatherWarning)
            cube.memchunk.plan("mean", dim="time").apply()  # 63 kB: gathered at no risk
        result.tas.isel(time=slice(0, 10)).compute()
    report = RunReport(
        "rolling", 4, 10, 10, 10, 100, 2, 0, gathered=plan.runs[-1].gather, format=str
    ).explain()
    assert re.search(r"^result gathered +computing the result in one piece", report, re.M)
    assert report.rstrip().splitlines()[-2].endswith("may be this, not the operator's tasks)")


def test_a_clusters_stated_minimum_allows_for_the_workers_memory_moving():
    """Two trials' functions, refused at 350 MB, were refused again on a new cluster at the
    minimum stated (384.63 then 385.43 MiB; 386.02 then 387.01): the baseline is the largest
    worker's memory, read when the plan is made, which planning's measurements move."""
    from types import SimpleNamespace

    from xarray_memchunk.memory_limits import PLANNING_GROWTH_BYTES, make_budget
    from xarray_memchunk.refusals import minimum_first

    operator = SimpleNamespace(name="anom")
    refused = xm.InfeasiblePlanError("no room", minimum_memory_limit=400 * 2**20)
    cluster = make_budget(
        350 * 10**6, 2, 2, "distributed client tcp://127.0.0.1:8786", worker_baseline=190 * 2**20
    )
    led = minimum_first(refused, cluster, operator)
    allowance = led.minimum_memory_limit - 400 * 2**20
    assert allowance == pytest.approx(PLANNING_GROWTH_BYTES / cluster.pause_fraction, abs=1)
    assert "a new cluster's workers may hold up to 8.00 MiB more" in str(led)
    # a budget made by hand, or the threaded scheduler's configured baseline, does not move
    by_hand = make_budget(350 * 10**6, 2, 2, "by hand", worker_baseline=190 * 2**20)
    threaded = make_budget(
        350 * 10**6, 2, 1, "threads", worker_baseline=190 * 2**20, threaded_scheduler=True
    )
    for fixed in (by_hand, threaded):
        assert minimum_first(refused, fixed, operator).minimum_memory_limit == 400 * 2**20


def test_a_refusal_states_one_minimum_where_room_for_a_task_was_not_enough():
    """A new user's refusal gave two minimums: "give each worker at least 395.68 MiB", then in
    its reasons "Give each worker at least 366.73 MiB (memory_limit); twice that leaves a task
    about 132.02 MiB per thread ... Planned at that memory_limit, ... needs more: 395.68 MiB"."""
    from types import SimpleNamespace

    from xarray_memchunk.memory_limits import make_budget
    from xarray_memchunk.refusals import minimum_first

    budget = make_budget(350 * 10**6, 2, 2, "by hand", worker_baseline=190 * 2**20)
    needed = 400 * 2**20
    refused = xm.InfeasiblePlanError(
        "'anom': a worker with 333.79 MiB of memory has no room for a task: Dask pauses it at "
        "0.8 x its memory (267.03 MiB), and the worker would hold between tasks 293.38 MiB. "
        "Give each worker at least 366.73 MiB (memory_limit); twice that leaves a task about "
        "132.02 MiB per thread (its baseline: a worker's memory once it has run 'anom'). "
        f"Planned at that memory_limit, 'anom' needs more: "
        f"{budget.memory_limit_advice(needed)}",
        minimum_memory_limit=needed,
    )
    led = str(minimum_first(refused, budget, SimpleNamespace(name="anom")))
    assert "366.73" not in led and "twice that leaves" not in led
    assert set(re.findall(r"at least (\S+ \S+) \(memory_limit\)", led)) == {"400.00 MiB"}
    assert "has no room for a task" in led and "Planned with room for a task, 'anom'" in led


def test_a_no_room_refusal_names_the_baseline_beside_its_figure():
    """A new user's refusal ended "... twice that leaves a task about 97.76 MiB per thread (its
    baseline: a worker's memory once it has run 'fc', ...)", the source left hanging after the
    advice; and a configured baseline read "the worker already holds 190.73 MiB" where the
    workers held 128.8 MiB."""
    from xarray_memchunk.errors import BudgetError
    from xarray_memchunk.memory_limits import make_budget
    from xarray_memchunk.planning.budget import with_baseline

    budget = make_budget(
        350 * 10**6,
        2,
        2,
        "client",
        worker_baseline=150 * 2**20,
        baseline_source="the largest worker's process memory now",
        in_this_process=True,
    )
    with pytest.raises(BudgetError) as raised:
        with_baseline(budget, 292 * 2**20, "a worker's memory once it has run 'fc'")
    said = str(raised.value)
    assert "292.00 MiB (its baseline: a worker's memory once it has run 'fc')" in said
    assert said.endswith("per thread")
    with pytest.raises(BudgetError) as configured:
        make_budget(250 * 10**6, 2, 2, "the LocalCluster to start")
    assert "is counted as holding 190.73 MiB (memchunk.worker-baseline" in str(configured.value)


def test_a_refusal_measures_a_function_with_no_model_before_it_states_a_minimum():
    """A new user's anomaly function was refused at 250 MB with the room for a task
    (248.42 MiB), and refused there again with 285.23 MiB once planning measured it: what its
    runs leave in a worker raised the baseline. The search now measures it as asked."""
    from xarray_memchunk.errors import CalibrationError
    from xarray_memchunk.memory_limits import make_budget
    from xarray_memchunk.refusals import least_memory_that_plans

    room = make_budget(260_000_000, 2, 2, "test", pause_fraction=0.8, reserve=0.1)
    measured_needs = 300_000_000
    calls = []

    def replan(budget, measure):
        calls.append((budget.worker_memory, measure))
        if measure == "never" and not any(m == "auto" for _, m in calls[:-1]):
            raise CalibrationError("operator 'anom' has no memory model for float32 yet")
        if budget.worker_memory < measured_needs:
            raise xm.InfeasiblePlanError(
                "its runs raise the baseline", minimum_memory_limit=measured_needs
            )

    assert least_memory_that_plans(room, 260_000_000, replan, "auto") == measured_needs
    assert (260_000_000, "auto") in calls
    # told never to measure, nothing is said beyond the room
    calls.clear()
    assert least_memory_that_plans(room, 260_000_000, replan, "never") is None
