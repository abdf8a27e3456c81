"""A plan that runs itself: plan -> apply -> report on one object (issue 29), and measure=."""

import gc
import weakref

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import xarray_memchunk as xm
from xarray_memchunk import api, cli
from xarray_memchunk.datasets import synthetic_climate
from xarray_memchunk.measure import runs
from xarray_memchunk.operators import production


def series(seed: int) -> xr.DataArray:
    """A graph of two layers (a generator, then a conversion): its production is measured."""
    data = da.random.default_rng(seed).standard_normal((400, 60, 80), chunks=(100, 60, 80))
    return xr.DataArray(data.astype("float32"), dims=("time", "y", "x"), name="anomaly")


@pytest.fixture
def no_self_calibration(monkeypatch):
    """Measuring a function fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a function was measured")

    monkeypatch.setattr(api, "self_calibrate", refuse)


def test_the_plan_reads_as_its_chunk_plan():
    array = series(1)
    plan = xm.plan(array, "mean", dim="time", memory_limit="1GB")
    assert isinstance(plan, xm.Plan) and isinstance(plan.chunk_plan, xm.ChunkPlan)
    assert plan.obj.data is array.data and plan.measure == "auto" and plan.runs == []
    inner = plan.chunk_plan
    for name in ("chunks", "dask_chunks", "predicted_peak_bytes", "budget", "binding", "notes"):
        assert getattr(plan, name) == getattr(inner, name)
    assert plan.fits == inner.fits and plan.explain() == inner.explain() == str(plan)
    assert repr(plan) == "Plan" + repr(inner).removeprefix("ChunkPlan")
    assert "<table>" in plan._repr_html_() and "dask_chunks" in dir(plan)
    with pytest.raises(AttributeError):
        plan.no_such_attribute  # noqa: B018


def test_apply_runs_the_plan_it_holds_without_planning_again(monkeypatch):
    """``apply`` planned again from scratch; a plan made before apply could differ from it."""
    array = series(2)
    plan = array.memchunk.plan("mean", dim="time", memory_limit="1GB")

    def refuse(*args, **kwargs):
        raise AssertionError("planned again")

    monkeypatch.setattr(api, "_prepare", refuse)
    result = plan.apply(record_plan=True)
    assert result.data.chunks == tuple(plan.dask_chunks[d] for d in ("y", "x"))
    assert isinstance(result.attrs["memchunk_plan"], str)  # nothing unserialisable in attrs
    assert plan.runs == []  # no cluster: no run


_PREPARE = api._prepare


def test_the_shortcuts_are_plan_then_apply(monkeypatch):
    made = []
    real = api.Plan.apply

    def apply(self, *, record_plan=False):
        made.append(self)
        return real(self, record_plan=record_plan)

    monkeypatch.setattr(api.Plan, "apply", apply)
    array = series(3)
    out = array.memchunk.apply("mean", dim="time", memory_limit="1GB", record_plan=True)
    assert len(made) == 1 and made[0].obj.data is array.data
    assert out.attrs["memchunk_plan"].startswith("mean: chunks")
    xm.apply(array, "mean", dim="time", memory_limit="1GB")
    assert len(made) == 2


def test_a_report_without_a_run_says_how_to_get_one():
    array = series(4)
    plan = array.memchunk.plan("mean", dim="time", memory_limit="1GB")
    with pytest.raises(xm.MemchunkError, match=r"run it with plan\.apply\(\)"):
        plan.report()
    result = plan.apply()
    with pytest.raises(xm.MemchunkError, match="result built without one has no run"):
        xm.report(result)
    with pytest.raises(xm.MemchunkError, match="not a result of memchunk's apply"):
        xm.report(result + 1)


def test_the_module_keeps_no_plans_or_clients_by_signature():
    assert not hasattr(runs, "_TRACKED") and not hasattr(runs, "_LAST")
    assert not hasattr(runs, "signature") and not hasattr(runs, "track")


# measure=


def test_measure_never_leaves_the_production_out_and_computes_nothing(produced):
    base = da.random.default_rng(5).standard_normal((400, 60, 80), chunks=(100, 60, 80))
    array = xr.DataArray(base.astype("float32").map_blocks(produced), dims=("time", "y", "x"))
    produced.shapes.clear()  # what map_blocks ran to infer the result's type
    calls = []
    with dask.config.set(scheduler=lambda *a, **k: calls.append(1)):
        plan = array.memchunk.plan("mean", dim="time", memory_limit="1GB", measure="never")
        plan.apply()
    assert produced.shapes == [] and calls == []  # no block computed, on any scheduler
    assert plan.produce_bytes == 0 and plan.measure == "never"
    assert "  producing" not in plan.explain()
    assert "measure='never': nothing was run" in plan.explain()
    auto = array.memchunk.plan("mean", dim="time", memory_limit="1GB")  # the default measures
    assert len(produced.shapes) == production.MEASUREMENTS and auto.produce_bytes > 0
    assert not any("measure='never'" in n for n in auto.notes)


def double(block):
    return block * 2


def test_measure_never_refuses_a_function_without_a_memory_model(
    tmp_path, monkeypatch, no_self_calibration
):
    monkeypatch.setenv("MEMCHUNK_CALIBRATION_DIR", str(tmp_path))
    op = xm.BlockwiseOperator("never-double", double)
    data = xr.DataArray(np.zeros((200, 100)), dims=("y", "x")).chunk({"y": 50})
    needle = r"'never-double' has no memory model.*measure='auto'.*xm\.calibrate"
    with pytest.raises(xm.CalibrationError, match=needle):
        data.memchunk.plan(op, memory_limit="1GB", measure="never")
    with pytest.raises(xm.CalibrationError, match=needle):
        xm.apply(data, op, memory_limit="1GB", measure="never")
    both = xr.Dataset({"a": data, "b": data + 1})  # refused, not left out as unsuitable
    with pytest.raises(xm.CalibrationError, match=needle):
        both.memchunk.plan(op, memory_limit="1GB", measure="never")
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing saved
    modelled = xm.BlockwiseOperator(
        "never-modelled", double, memory_model=xm.LinearMemoryModel({"input_bytes": 2.0})
    )
    assert data.memchunk.plan(modelled, memory_limit="1GB", measure="never").n_chunks >= 1


@pytest.mark.parametrize("value", ["sometimes", "Never", None, True])
def test_measure_takes_auto_or_never_only(value, produced, no_self_calibration):
    array = xr.DataArray(
        da.random.default_rng(6).random((40, 30), chunks=10).map_blocks(produced), dims=("t", "x")
    )
    produced.shapes.clear()
    for call in (
        lambda: xm.plan(array, "mean", dim="t", measure=value),
        lambda: array.memchunk.plan("mean", dim="t", measure=value),
        lambda: array.memchunk.apply("mean", dim="t", measure=value),
    ):
        with pytest.raises(xm.MemchunkError, match=r"measure=.* not one of 'auto', 'never'"):
            call()
    assert produced.shapes == []


def test_the_command_line_takes_measure(tmp_path, capsys):
    path = tmp_path / "tas.nc"
    synthetic_climate(120, 18, 24).to_netcdf(path)
    parser = cli._build_parser()
    for command in ("plan", "run"):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        assert "--measure {auto,never}" in capsys.readouterr().out
    args = ["plan", "mean", str(path), "--dim", "time", "--memory-limit", "1GB"]
    assert cli._main([*args, "--measure", "never"]) == 0
    assert "measure='never': nothing was run" in capsys.readouterr().out
    assert cli._main(args) == 0
    assert "measure='never'" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli._main([*args, "--measure", "sometimes"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


# on a cluster


@pytest.fixture
def inproc_client(quiet_distributed):
    """A client of a one-worker cluster in this process (no network at all)."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def random_field(seed: int) -> xr.DataArray:
    data = da.random.default_rng(seed).random((400, 300), chunks=(100, 300))
    return xr.DataArray(data, dims=("time", "x"))


@pytest.mark.cluster
def test_two_datasets_with_equal_plans_report_their_own_tasks(inproc_client):
    """Equal plans (operator, chunks, prediction) of two datasets shared one record before."""
    chunks = {"time": 100, "x": 30}
    first = random_field(1).memchunk.plan("mean", dim="time", chunks=chunks)
    second = random_field(2).memchunk.plan("mean", dim="time", chunks=chunks)
    assert first.dask_chunks == second.dask_chunks
    assert first.predicted_task_bytes == second.predicted_task_bytes
    one, two = first.apply(), second.apply()
    one.compute()
    alone = first.report(learn=False).n_tasks
    assert alone > 0
    assert second.report(learn=False).n_tasks == 0  # applied, not computed yet
    two.compute()
    assert first.report(learn=False).n_tasks == alone  # the second run's tasks are not its
    assert second.report(learn=False).n_tasks == alone  # the same plan on other data
    assert first.runs[-1].client() is inproc_client and len(first.runs) == 1


@pytest.mark.cluster
def test_a_report_before_the_compute_says_to_compute_first(inproc_client):
    plan = random_field(5).memchunk.plan("mean", dim="time", chunks={"time": 100, "x": 30})
    plan.apply()
    assert "compute the result first" in plan.report(learn=False).explain()


def test_a_plan_runs_the_data_it_was_made_for():
    """A Dataset changed in place after planning: the plan's chunks and dtype were for the old."""
    ds = xr.Dataset({"t": random_field(6).astype("float32")})
    plan = ds.memchunk.plan("median", dim="time", memory_limit="1GB")
    ds["t"] = ds["t"].astype("float64") * 10
    result = plan.apply()
    assert result["t"].dtype == np.float32
    xr.testing.assert_allclose(result["t"].compute(), plan.obj["t"].median("time").compute())


@pytest.mark.cluster
def test_a_result_of_apply_reports_on_its_own_run(inproc_client):
    result = xm.apply(random_field(3), "mean", dim="time", chunks={"time": 100, "x": 30})
    result.compute()
    report = xm.report(result, learn=False)
    assert report.n_tasks > 0 and report.operator == "mean"
    assert result.memchunk.report(learn=False).n_tasks == report.n_tasks
    assert all(isinstance(v, str) for v in result.attrs.values())


@pytest.mark.cluster
def test_no_client_is_kept_once_the_plan_and_its_result_are_gone(quiet_distributed):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        plan = random_field(4).memchunk.plan("mean", dim="time", chunks={"time": 100})
        result = plan.apply()
        result.compute()
        assert plan.report(learn=False).n_tasks > 0
        held = weakref.ref(client)
        shortcut = xm.apply(random_field(5), "mean", dim="time")
    del plan, result, shortcut, client, cluster
    gc.collect()
    assert held() is None  # nothing in the package's modules holds the client
    assert len(api._RESULTS._entries) == 0 and len(runs._HELD) == 0


@pytest.mark.cluster
def test_memchunk_run_plans_once_on_the_cluster_it_planned_for(tmp_path, monkeypatch, capsys):
    """``memchunk run`` planned three times: before the cluster, on it, and again in apply."""
    path = tmp_path / "tas.nc"
    synthetic_climate(120, 18, 24).to_netcdf(path)
    planned = []

    def prepare(*args, **kwargs):
        planned.append(args[1])
        return _PREPARE(*args, **kwargs)

    monkeypatch.setattr(api, "_prepare", prepare)
    monkeypatch.setattr(cli, "_quiet_distributed", lambda: None)
    args = ["run", "mean", str(path), str(tmp_path / "mean.zarr"), "--dim", "time"]
    args += ["--nworkers", "1", "--memory-limit", "2GB"]
    # a configured baseline above what the fresh worker holds: its budget is the one planned
    with dask.config.set({"memchunk.worker-baseline": "800MB"}):
        assert cli._main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert planned == ["mean"]
    assert "predicted against measured" in out and "wrote" in out
    assert "source: the LocalCluster to start" in out
    tasks = next(line for line in out.splitlines() if line.startswith("tasks measured"))
    assert int(tasks.split()[2]) > 0


def test_a_plan_pickles_as_its_chunk_plan_and_compares_by_it():
    import pickle

    array = random_field(8)
    plan = array.memchunk.plan("mean", dim="time", memory_limit="2GB")
    again = array.memchunk.plan("mean", dim="time", memory_limit="2GB")
    assert plan == again and plan == plan.chunk_plan  # equal as ChunkPlans were
    sent = pickle.loads(pickle.dumps(plan))  # its costs hold local functions: it failed
    assert sent == plan.chunk_plan and sent.explain() == plan.explain()


def test_a_result_computed_without_a_cluster_keeps_no_input_alive():
    source = np.random.default_rng(0).random((1000, 100))
    alive = weakref.ref(source)
    result = xm.apply(xr.DataArray(source, dims=("t", "x")), "mean", dim="t", memory_limit="2GB")
    result.load()
    del source
    gc.collect()
    assert alive() is None  # the module's registry kept the plan, and the plan the input


def test_a_staged_plan_applied_twice_writes_its_store_once(tmp_path, monkeypatch):
    from xarray_memchunk.operators import staging

    written = []
    stage = staging.stage

    def counted(*args, **kwargs):
        written.append(args[0].name)
        return stage(*args, **kwargs)

    monkeypatch.setattr(api, "stage", counted)
    data = da.random.default_rng(3).random((600, 200, 200), chunks=(50, 200, 200))
    array = xr.DataArray(data, dims=("time", "y", "x"), name="t")
    with dask.config.set({staging.STAGING_DIR_KEY: str(tmp_path), "scheduler": "threads"}):
        plan = array.memchunk.plan("median", dim="time", memory_limit="0.5GB")
        assert plan.notes and any("temporary Zarr store" in n for n in plan.notes)
        first, second = plan.apply(), plan.apply()
    assert written == ["t"]  # a second full store, with no new check of free space, before
    assert first.data.name == second.data.name


@pytest.mark.cluster
@pytest.mark.parametrize("saturation", [1.1, 1.0])
def test_a_plan_of_a_few_tasks_per_thread_says_when_the_scheduler_queues_ahead(
    saturation, quiet_distributed
):
    """At distributed's default a worker is sent a task beyond its thread (the median's 6
    tasks on 2 single-thread workers split 4/2); the scheduler queues only groups of more than
    twice its threads."""
    from distributed import Client, LocalCluster

    setting = {"distributed.scheduler.worker-saturation": saturation}
    with (
        dask.config.set(setting),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster),
    ):
        field = random_field(7)
        few = field.memchunk.plan("mean", dim="time", chunks={"time": 400, "x": 75})
        two = field.memchunk.plan("mean", dim="time", chunks={"time": 400, "x": 150})
        many = field.memchunk.plan("mean", dim="time", chunks={"time": 400, "x": 30})
    assert (few.n_chunks, two.n_chunks, many.n_chunks) == (4, 2, 10)
    queued = [n for n in few.notes if "worker-saturation" in n]
    if saturation > 1:
        assert (
            queued and "worker-saturation 1.1" in queued[0] and "4.0 tasks per thread" in queued[0]
        )
    else:
        assert not queued
    assert not any("worker-saturation" in n for n in (*two.notes, *many.notes))


def test_the_scheduler_is_asked_with_a_function_it_needs_no_package_for():
    """A remote scheduler without xarray_memchunk installed runs it (sent by value)."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from distributed.protocol.pickle import dumps

    from xarray_memchunk.clusters import scheduler_queueing

    sent = []

    def run_on_scheduler(function):
        sent.append(dumps(function))
        return function(SimpleNamespace(WORKER_SATURATION=1.1, total_nthreads=4))

    assert scheduler_queueing(SimpleNamespace(run_on_scheduler=run_on_scheduler)) == (1.1, 4)
    elsewhere = (
        "import sys; sys.modules['xarray_memchunk'] = None\n"
        "from types import SimpleNamespace\n"
        "from distributed.protocol.pickle import loads\n"
        "ask = loads(sys.stdin.buffer.read())\n"
        "print(ask(SimpleNamespace(WORKER_SATURATION=1.25, total_nthreads=8)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", elsewhere], input=sent[0], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-1000:]
    assert done.stdout.decode().strip() == "(1.25, 8)"


def test_an_alternative_not_taken_states_both_estimates():
    """A new user's groupby note said map-reduce "is estimated 1.0x as long": no reason."""
    from types import SimpleNamespace

    from xarray_memchunk.api import _slower

    def prepared(seconds: float):
        return SimpleNamespace(plan=SimpleNamespace(estimated_seconds=seconds))

    label, why = _slower("method='map-reduce'", prepared(3.47), prepared(3.43))
    assert label == "method='map-reduce'"
    assert "1.01x as long (3.5 s against 3.4 s" in why


def test_the_most_tasks_a_plan_may_have_is_the_dask_config_key_memchunk_max_tasks():
    ds = synthetic_climate(365, 180, 360)  # 94.6 MB: over one task of 400 MB workers
    plan = ds.memchunk.plan("median", dim="time", memory_limit="400MB")
    assert plan.n_chunks > 2
    with (
        dask.config.set({"memchunk.max-tasks": 2}),
        pytest.raises(xm.InfeasiblePlanError, match="has more than 2 chunks") as err,
    ):
        ds.memchunk.plan("median", dim="time", memory_limit="400MB")
    assert err.value.minimum_memory_limit > xm.units.to_bytes("400MB")
    with dask.config.set({"memchunk.max-tasks": 1e6}):  # as YAML reads it
        assert ds.memchunk.plan("median", dim="time", memory_limit="400MB") == plan
    with (
        dask.config.set({"memchunk.max-tasks": "many"}),
        pytest.raises(xm.MemchunkError, match=r"memchunk\.max-tasks must be a whole number"),
    ):
        ds.memchunk.plan("median", dim="time", memory_limit="400MB")
