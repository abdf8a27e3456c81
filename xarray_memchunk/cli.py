"""The ``memchunk`` command line: plan, run, ingest, demo, calibrate, operators.

Bad input (missing file, not a dataset, unknown variable or operator, missing dims, an operator
option of the wrong type, unparsable sizes, counts out of range, an output that exists, is not a
dataset ``--overwrite`` may replace, overlaps the input, or whose directory is not one, a
scheduler address that is not one or a scheduler lost) exits with status 2 and one line on
stderr, no traceback; ``run`` checks all of it, and plans, before it starts a cluster. Ctrl-C
and SIGTERM end any command with status 130 or 143 (128 + the signal's number) and one line,
after removing its partial output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from . import interrupts
from .errors import MemchunkError

DEMO_SIZE = 200
DEMO_MIN_SIZE = 20
DEMO_MEMORY_LIMIT = "1.5GB"
#: Seconds between progress lines when stdout is not a terminal (a log file, CI).
PROGRESS_PERIOD_S = 10.0
#: LocalCluster workers per CPU of this machine, at most: each is a process with its own memory
#: limit and baseline, and more only take turns on the same cores.
MAX_WORKERS_PER_CPU = 4
#: Seconds to wait for a ``--scheduler`` to answer, when connecting and when reconnecting.
SCHEDULER_TIMEOUT_S = 10
#: Seconds to wait for a scheduler to accept a connection, asking whether it is still there.
SCHEDULER_PROBE_TIMEOUT_S = 2
#: The queue depth of the LocalCluster ``run`` starts, where the user did not choose one: a
#: worker is sent its next root task when it reports one finished. At the default
#: of 1.1 a 1-thread worker holds a second task behind the running one, committed a task's
#: duration ahead; with tasks of a second, one worker may end with two to run while the other
#: idles (GST3D of a 384^3 volume on 2 x 1 thread: 4.14 s at 1.1, 3.88 s at 1.0, median of
#: 5; the runs split 5/3 took 4.50-4.52 s; ``python benchmarks/queue_tail.py``).
OWN_CLUSTER_SATURATION = 1.0


def _parse_option(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise MemchunkError(f"operator option {text!r} must look like KEY=VALUE, e.g. sigma=1.5")
    key, value = text.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _op_kwargs(op: str, options: list[str] | None, dims: list[str] | None = None) -> dict[str, Any]:
    """``op``'s options (``-o``, ``--dim``), checked by the operator before anything starts."""
    from .operators import get_operator

    kwargs = dict(_parse_option(o) for o in options or [])
    if dims:
        if "dim" in kwargs:
            raise MemchunkError(
                f"--dim and -o dim={kwargs['dim']} both name the dim: give one of them"
            )
        kwargs["dim"] = dims if len(dims) > 1 else dims[0]
    get_operator(op).check_arguments(kwargs)
    return kwargs


def _add_options(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The repeatable ``-o KEY=VALUE`` flag for an operator's options."""
    parser.add_argument("-o", "--option", metavar="KEY=VALUE", action="append", help=help_text)


def _at_least_one(value: int, flag: str) -> int:
    if value < 1:
        raise MemchunkError(f"{flag} must be at least 1, got {value}")
    return value


def _local_workers(value: int) -> int:
    """``--nworkers`` for a LocalCluster: at least one, at most a few per CPU of this machine."""
    _at_least_one(value, "--nworkers")
    cpus = os.cpu_count() or 1
    limit = MAX_WORKERS_PER_CPU * cpus
    if value > limit:
        raise MemchunkError(
            f"--nworkers {value} is more than {limit} ({MAX_WORKERS_PER_CPU} per CPU, this "
            f"machine has {cpus}): every LocalCluster worker is a process here, with its own "
            f"memory limit and baseline; use fewer, or --scheduler for a larger cluster"
        )
    return value


def _scheduler_address(address: str) -> str:
    """``address`` if it names a Dask scheduler (``tcp://HOST:PORT``, ``HOST:PORT``...)."""
    from ._dask_compat import check_scheduler_address

    try:
        check_scheduler_address(address)
    except ValueError as exc:
        raise MemchunkError(
            f"--scheduler {address!r} is not a scheduler address ({exc}); give it as "
            f"tcp://HOST:PORT, e.g. tcp://127.0.0.1:8786"
        ) from exc
    return address


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("op", metavar="OP", help="operator name (see `memchunk operators`)")
    parser.add_argument(
        "input",
        metavar="INPUT",
        help="Zarr store, netCDF or SEG-Y file, or a quoted pattern of netCDF files "
        "('data/tas_*.nc', opened together as open_mfdataset does)",
    )
    parser.add_argument(
        "--var", metavar="NAME", help="variable to use (default: every suitable one)"
    )
    parser.add_argument(
        "--dim",
        metavar="DIM",
        action="append",
        help="dim the operator acts on (name or CF axis such as T); repeatable",
    )
    _add_options(parser, "operator option, e.g. -o sigma=1.5 -o attribute=azimuth; repeatable")
    parser.add_argument(
        "--measure",
        choices=("auto", "never"),
        default="auto",
        help="what planning may run to measure what it needs: auto (a function without a "
        "memory model, one block of a graph's input, the staging disk; the plan's notes say "
        "what was) or never (nothing: a function without a memory model is refused, and a "
        "graph's input is planned without what producing it holds) (default auto)",
    )


def _add_cluster(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="existing Dask scheduler, e.g. tcp://host:8786 (budget from its workers)",
    )
    parser.add_argument("--nworkers", type=int, default=2, help="LocalCluster workers (default 2)")
    parser.add_argument("--nthreads", type=int, default=1, help="threads per worker (default 1)")
    parser.add_argument(
        "--memory-limit",
        default="auto",
        metavar="SIZE",
        help="memory limit per worker, e.g. 1.5GB (default: auto)",
    )


def _add_fill(parser: argparse.ArgumentParser) -> None:
    """The ``--fill`` flag: the value of a SEG-Y file's missing traces."""
    parser.add_argument(
        "--fill",
        type=float,
        metavar="VALUE",
        help="SEG-Y input: value of missing traces, e.g. nan (default: refuse a file with "
        "missing traces)",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memchunk",
        description="Memory-aware chunking for xarray + Dask: plan chunks from the operator's "
        "memory model and the memory each task may use, then run.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    plan = sub.add_parser(
        "plan",
        help="print the chunk plan for OP on INPUT (the operator is not run; what is measured "
        "to plan it, the plan's notes say; --measure never measures nothing)",
    )
    _add_common(plan)
    _add_fill(plan)
    _add_cluster(plan)  # the cluster `memchunk run` would run on, with the same defaults

    run = sub.add_parser(
        "run", help="compute OP on INPUT and write OUTPUT (Zarr, or netCDF by suffix)"
    )
    _add_common(run)
    run.add_argument("output", metavar="OUTPUT", help="Zarr store, or .nc file")
    run.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    _add_fill(run)
    _add_cluster(run)

    ingest = sub.add_parser(
        "ingest",
        help="convert a SEG-Y file to Zarr (or netCDF by suffix), with storage chunks chosen "
        "for the operator that will read it",
    )
    ingest.add_argument("input", metavar="INPUT", help="SEG-Y file (.sgy, .segy)")
    ingest.add_argument("output", metavar="OUTPUT", help="Zarr store, or .nc file")
    ingest.add_argument(
        "--for",
        dest="op",
        metavar="OP",
        help="choose storage chunks that OP's plan reads whole (default: 128 along every dim)",
    )
    _add_options(ingest, "option of the --for operator, e.g. -o sigma=1.5; repeatable")
    _add_fill(ingest)
    ingest.add_argument(
        "--iline", type=int, default=189, metavar="BYTE", help="inline number header byte"
    )
    ingest.add_argument(
        "--xline", type=int, default=193, metavar="BYTE", help="crossline number header byte"
    )
    ingest.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    _add_cluster(ingest)

    demo = sub.add_parser(
        "demo",
        help="GST3D on a generated volume, the seed's NumPy version and the built-in one: Dask "
        "auto chunks vs memchunk, side by side",
    )
    demo.add_argument(
        "--size", type=int, default=DEMO_SIZE, help=f"volume edge (default {DEMO_SIZE})"
    )
    demo.add_argument(
        "--memory-limit",
        default=DEMO_MEMORY_LIMIT,
        metavar="SIZE",
        help=f"memory limit per worker (default {DEMO_MEMORY_LIMIT})",
    )
    demo.add_argument(
        "--plot",
        default="memchunk-demo.png",
        metavar="PATH",
        help="where to save worker memory over time (default memchunk-demo.png)",
    )

    cal = sub.add_parser(
        "calibrate",
        help="profile OP inside a Dask worker, fit its memory model, save a user calibration",
    )
    cal.add_argument("op", metavar="OP", help="operator name")
    cal.add_argument(
        "--dtype",
        action="append",
        metavar="DTYPE",
        help="input dtype to calibrate; repeatable (default float32 and float64)",
    )
    cal.add_argument("--repeats", type=int, default=3, help="runs per shape (default 3)")
    cal.add_argument(
        "--forget",
        action="store_true",
        help="measure nothing: delete what runs taught about OP (its .learned.json files); OP "
        "may be the calibration key a report names (a function's: NAME-DIGEST)",
    )
    cal.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="cpu: NumPy chunks, host memory; gpu: CuPy chunks, device memory (default cpu)",
    )
    cal.add_argument(
        "--output-dir",
        metavar="DIR",
        help="where to write (default: the user calibration directory)",
    )
    _add_options(cal, "operator option, e.g. -o kernel=d2geo; repeatable")

    sub.add_parser("operators", help="list the registered operators")
    return parser


def _cmd_plan(args: argparse.Namespace) -> int:
    from .io import open_input

    obj = open_input(args.input, args.var, fill=args.fill)
    kwargs = _op_kwargs(args.op, args.option, args.dim)
    budget = _budget_for(args, obj, kwargs)
    if budget is None:  # --scheduler: the budget of its workers, as `memchunk run` takes it
        with _scheduler_client(args.scheduler):
            plan = obj.memchunk.plan(args.op, measure=args.measure, **kwargs)
    else:  # the LocalCluster `memchunk run` starts with these options: the plan it runs
        with _as_on_a_cluster():
            plan = obj.memchunk.plan(args.op, budget=budget, measure=args.measure, **kwargs)
    print(plan.explain())
    return 0


def _worker_memory(args: argparse.Namespace) -> int:
    """Each LocalCluster worker's memory limit in bytes, as distributed will set it."""
    from .units import to_bytes

    if args.memory_limit != "auto":
        return to_bytes(args.memory_limit, what="--memory-limit")
    import logging
    import os

    from ._dask_compat import worker_memory_limit

    total = os.cpu_count() or 1
    return int(
        worker_memory_limit("auto", args.nthreads, total, logger=logging.getLogger(__name__))
    )


@contextlib.contextmanager
def _scheduler_client(address: str) -> Iterator[Any]:
    """A client of the scheduler at ``address``; losing that scheduler is a MemchunkError.

    Every connection to it (the client's, its reconnection, the progress bar's) gives up after
    :data:`SCHEDULER_TIMEOUT_S`, not distributed's default 30 s.
    """
    import dask
    from distributed import Client

    timeout = f"{SCHEDULER_TIMEOUT_S}s"
    with dask.config.set({"distributed.comm.timeouts.connect": timeout}):
        try:
            client = Client(address, timeout=timeout)
        except OSError as exc:  # a refused or timed-out connection
            raise MemchunkError(f"cannot connect to scheduler {address}: {exc}") from exc
        with client:
            try:
                yield client
            except Exception as exc:  # futures cancelled, "no workers": the scheduler is gone
                if client.status == "running" and _answers(address):
                    raise
                raise MemchunkError(
                    f"lost the connection to scheduler {address} (was it stopped?): "
                    f"{type(exc).__name__}: {_first_line(exc)}"
                ) from exc


def _answers(address: str) -> bool:
    """Whether the scheduler at ``address`` still accepts a connection.

    A computation can fail on a lost scheduler (distributed's own ``RuntimeError`` from an
    expiring timeout, seen on a scheduler killed mid-write) before the client notices it lost
    the connection and leaves its ``"running"`` status; asking the address settles it.
    Addresses other than TCP ones are taken to answer: the client's status decides for them.
    """
    import socket

    from distributed.comm import get_address_host_port, parse_address

    scheme, _ = parse_address(address)
    if scheme not in ("tcp", "tls"):
        return True
    host, port = get_address_host_port(address)
    try:
        with socket.create_connection((host, port), timeout=SCHEDULER_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""


def _own_cluster_config() -> dict[str, Any]:
    """Dask config for the LocalCluster a command starts: :data:`OWN_CLUSTER_SATURATION`.

    Empty where the user chose the queue depth: in a config file or the environment
    (``DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION``), even at distributed's default, or
    with ``dask.config.set`` to another value.
    """
    import dask
    import distributed  # noqa: F401  (registers distributed's defaults)

    from .clusters import WORKER_SATURATION_KEY

    default = dask.config.get(
        WORKER_SATURATION_KEY, None, config=dask.config.merge(*dask.config.defaults)
    )
    from_files = dask.config.get(WORKER_SATURATION_KEY, None, config=dask.config.collect())
    if from_files is not None or dask.config.get(WORKER_SATURATION_KEY, None) != default:
        return {}  # the user's own choice
    return {WORKER_SATURATION_KEY: OWN_CLUSTER_SATURATION}


@contextlib.contextmanager
def _client(args: argparse.Namespace) -> Iterator[Any]:
    import logging

    import dask
    from distributed import Client, LocalCluster

    if args.scheduler:
        with _scheduler_client(args.scheduler) as client:
            yield client
        return
    interrupts.quiet_resource_tracker()  # before the LocalCluster starts its workers with it
    with (
        dask.config.set(_own_cluster_config()),
        LocalCluster(
            n_workers=args.nworkers,
            threads_per_worker=args.nthreads,
            memory_limit=_worker_memory(args),
            dashboard_address=":0",
            silence_logs=logging.CRITICAL,  # it sets the level of distributed's logs
            preload=["xarray_memchunk.worker_preload"],  # a terminal's Ctrl-C ends them quietly
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def _progress(future) -> None:
    """Distributed's progress bar on a terminal; a plain line every few seconds elsewhere."""
    from distributed import progress

    from ._dask_compat import periodic_progress

    if sys.stdout.isatty():
        progress(future)
        print(flush=True)
        return

    def line(done: float, n_tasks: int, elapsed_s: float) -> None:
        print(f"{100 * done:.0f}% of {n_tasks} tasks done, {elapsed_s:.0f} s", flush=True)

    periodic_progress([future], line, PROGRESS_PERIOD_S)


def _prepare_output(args: argparse.Namespace) -> None:
    """Finish or undo what dead runs left at ``args.output``, then check it may be written."""
    from .io import check_target, input_paths, recover

    for message in recover(args.output):
        print(f"memchunk: {message}", flush=True)
    sources = input_paths(args.input)
    check_target(args.output, args.overwrite, sources=sources, option="--overwrite")


def _cmd_run(args: argparse.Namespace) -> int:
    from .io import input_paths, open_input, safe_write

    obj = open_input(args.input, args.var, fill=args.fill)
    kwargs = _op_kwargs(args.op, args.option, args.dim)
    _prepare_output(args)
    budget = _budget_for(args, obj, kwargs)
    planned = None
    if budget is not None:  # plan for the cluster about to start, before starting it
        with _as_on_a_cluster():
            planned = obj.memchunk.plan(args.op, budget=budget, measure=args.measure, **kwargs)

    def work(client) -> None:
        plan = planned
        # Planned once where the started cluster's workers have the budget planned for. Planned
        # again, from its workers, only where they differ (their memory, threads or count, or a
        # baseline already above the configured one): the plan must fit the workers that run it.
        # With --scheduler, once, from its workers.
        if plan is None or not _same_budget(budget, _cluster_budget(obj)):
            plan = obj.memchunk.plan(args.op, measure=args.measure, **kwargs)
        print(plan.explain(), flush=True)
        result = plan.apply(record_plan=True)  # written: never gathered into one worker
        safe_write(
            result,
            args.output,
            overwrite=args.overwrite,
            compute=_computer(client),
            sources=input_paths(args.input),
        )
        print("\npredicted against measured:\n" + plan.report().explain(), flush=True)

    return _on_cluster(args, work)


def _cmd_ingest(args: argparse.Namespace) -> int:
    from .seismic.ingest import check_source, ingest, storage_chunks_for
    from .seismic.segy import open_segy

    kwargs = {}
    if args.op is not None:
        kwargs = _op_kwargs(args.op, args.option)
    elif args.option:
        raise MemchunkError("-o/--option sets options of the --for operator: name it with --for")
    segy = {"fill": args.fill, "iline": args.iline, "xline": args.xline}
    check_source(args.input)
    volume = open_segy(args.input, **segy)
    _prepare_output(args)
    # with --for OP, where a worker has no room for a task: OP's minimum, as plan states it
    budget = _local_budget(args) if args.op is None else _budget_for(args, volume, kwargs)
    if budget is not None:  # check the plan before starting the cluster
        storage_chunks_for(volume, args.op, memory_limit=budget, **kwargs)

    def write(memory_limit: Any, compute) -> None:
        _, storage, reason = ingest(
            args.input,
            args.output,
            operator=args.op,
            memory_limit=memory_limit,
            overwrite=args.overwrite,
            compute=compute,
            segy_options=segy,
            **kwargs,
        )
        sizes = ", ".join(f"{d}: {n}" for d, n in storage.items())
        print(f"storage chunks {sizes}: {reason}", flush=True)

    if budget is None:  # --scheduler: on its workers, with their budget
        return _on_cluster(args, lambda client: write(None, _computer(client)))
    # No LocalCluster to start: each write task reads and writes whole storage chunks, at most
    # a quarter of a task's budget, so threads in this process hold no more than the workers
    # would, and the cluster's start (seconds) is saved.
    threads = args.nworkers * args.nthreads
    return _writing(args, lambda: write(budget, _threaded_computer(threads)))


@contextlib.contextmanager
def _as_on_a_cluster() -> Iterator[None]:
    """Plan before a LocalCluster starts as on it: with a distributed task's overhead.

    Without a client, planning takes the threaded scheduler's overhead per task; the plan is
    for the cluster about to start, and is run there.
    """
    import dask

    from .planning.problem import DISTRIBUTED_TASK_OVERHEAD_S

    if dask.config.get("memchunk.task-overhead", None) is not None:
        yield
        return
    with dask.config.set({"memchunk.task-overhead": DISTRIBUTED_TASK_OVERHEAD_S}):
        yield


def _cluster_budget(obj: Any):
    """The budget of the active cluster's workers for ``obj``'s device."""
    from .api import data_device
    from .memory_limits import resolve_budget

    return resolve_budget(None, data_device(obj))


def _same_budget(planned, found) -> bool:
    """Whether two budgets have the same terms (where they came from aside).

    Compare the budget a plan was made for, not the plan's own: a plan may raise the baseline
    for what its operator leaves in a worker
    (:func:`~xarray_memchunk.planning.budget.with_baseline`).
    """
    terms = (
        "worker_memory",
        "threads_per_worker",
        "n_workers",
        "per_task",
        "worker_baseline",
        "reserve",
        "pause_fraction",
        "device",
    )
    return all(getattr(planned, t) == getattr(found, t) for t in terms)


def _budget_for(args: argparse.Namespace, obj: Any, kwargs: dict[str, Any]):
    """:func:`_local_budget`; where it has no room for a task, the refusal ``plan`` gives.

    That refusal states the least memory the operator's plan runs at, not the room for a task.
    """
    from .api import no_room_refusal_for
    from .errors import BudgetError

    try:
        return _local_budget(args)
    except BudgetError as no_room:
        if no_room.budget_at_minimum is None:
            raise
        with _as_on_a_cluster():
            measure = getattr(args, "measure", "auto")  # memchunk ingest has no --measure
            refusal = no_room_refusal_for(obj, args.op, no_room, measure=measure, **kwargs)
        raise refusal from None


def _local_budget(args: argparse.Namespace):
    """The budget of the LocalCluster ``args`` describe; None with ``--scheduler``.

    Checks the cluster's options first: the scheduler's address, or the LocalCluster's counts.
    """
    from .memory_limits import machine_cores, make_budget

    if args.scheduler:
        _scheduler_address(args.scheduler)
        return None
    _local_workers(args.nworkers)
    _at_least_one(args.nthreads, "--nthreads")
    return make_budget(  # its workers share this machine's cores
        _worker_memory(args),
        args.nthreads,
        args.nworkers,
        "the LocalCluster to start",
        cores=machine_cores(),
    )


def _computer(client):
    """Run a delayed write on ``client`` with a progress bar (or progress lines)."""

    def compute(delayed) -> None:
        future = client.compute(delayed)
        try:
            _progress(future)
            future.result()
        except BaseException:  # an interrupt too: no task left to start on the workers
            future.cancel()
            raise

    return compute


def _threaded_computer(threads: int):
    """Run a delayed write with ``threads`` threads in this process, reporting progress."""

    def compute(delayed) -> None:
        from .io import compute_in_own_pool

        with _threaded_progress():  # no task still writing when the output is removed
            compute_in_own_pool(delayed, threads)

    return compute


def _threaded_progress():
    """Dask's progress bar on a terminal; a plain line every few seconds elsewhere."""
    from dask.callbacks import Callback
    from dask.diagnostics import ProgressBar

    if sys.stdout.isatty():
        return ProgressBar()

    class _Lines(Callback):
        def _start(self, dsk) -> None:
            import time

            self._clock = time.perf_counter
            self._began = self._last = self._clock()
            self._tasks, self._done = len(dsk), 0

        def _posttask(self, key, result, dsk, state, worker_id) -> None:
            self._done += 1
            if self._clock() - self._last >= PROGRESS_PERIOD_S:
                self._line()

        def _finish(self, dsk, state, errored) -> None:
            if not errored:
                self._line()

        def _line(self) -> None:
            self._last = self._clock()
            done = self._done / self._tasks if self._tasks else 1.0
            elapsed = self._last - self._began
            print(f"{100 * done:.0f}% of {self._tasks} tasks done, {elapsed:.0f} s", flush=True)

    return _Lines()


def _on_cluster(args: argparse.Namespace, work) -> int:
    """Run ``work(client)`` on the cluster ``args`` name, writing ``args.output``."""
    _quiet_distributed()

    def run() -> None:
        with _client(args) as client:
            work(client)

    return _writing(args, run)


def _writing(args: argparse.Namespace, run: Callable[[], None]) -> int:
    """Run ``run()``, which writes ``args.output``; the command's exit status.

    A failed computation (a worker's error, KilledWorker) is one line and status 1; any
    failure or interrupt removes the partial output. An interrupt a library caught (the run
    went on) ends the command as an interrupt all the same.
    """
    from .io import recover

    before = interrupts.identity(args.output)
    with interrupts.writing(args.output):  # until recovered: the deadline's output
        try:
            run()
        except (MemchunkError, KeyboardInterrupt) as exc:
            with interrupts.recovering():  # the computation has stopped: remove what it wrote
                recover(args.output)
            raise _with_written(exc, args.output, before) from None
        except Exception as exc:  # a worker's error, KilledWorker: one line, not a traceback
            with interrupts.recovering():
                recover(args.output)
            caught = interrupts.received()
            if caught is not None:  # interrupted first: the failure followed from it
                raise _with_written(caught, args.output, before) from None
            print(
                f"memchunk: the computation failed: {type(exc).__name__}: {_first_line(exc)}",
                file=sys.stderr,
            )
            return 1
    caught = interrupts.received()
    if caught is not None:  # a library caught it and the run went on to its end
        raise _with_written(caught, args.output, before)
    print(f"wrote {args.output}")
    return 0


def _with_written(exc: BaseException, output: str, before: tuple[int, int] | None):
    """``exc``, marked with ``output`` where an interrupt found a new output in place."""
    if isinstance(exc, KeyboardInterrupt) and interrupts.new_output(output, before):
        exc.written = output  # in place before the interrupt: said so, not removed
    return exc


def _quiet_distributed() -> None:
    """Silence distributed's logs: the run reports its own progress and errors in one line.

    Its logs of a shutdown or a lost scheduler are noise, here (where its configuration gives
    some loggers, such as ``distributed.client``, their own level) and in the workers a
    LocalCluster starts (which read the level from the environment).
    """
    import logging

    import distributed  # noqa: F401  (configures its loggers)

    names = [n for n in logging.root.manager.loggerDict if n.startswith("distributed.")]
    for name in ["distributed", *names]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")


def _check_plot_path(path: str) -> None:
    """Refuse a ``--plot`` path the demo could not save to, before the demo runs."""
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        state = "does not exist" if not folder.exists() else "is not a directory"
        raise MemchunkError(f"--plot {path!r}: directory {str(folder)!r} {state}")
    if target.is_dir() or not os.access(folder, os.W_OK):
        raise MemchunkError(f"--plot {path!r} cannot be written: give a writable file path")
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:  # the demo says it makes no plot
        return
    kinds = FigureCanvasBase.get_supported_filetypes()
    if target.suffix and target.suffix[1:].lower() not in kinds:
        raise MemchunkError(
            f"--plot {path!r}: matplotlib cannot save {target.suffix!r} files; use one of "
            f"{', '.join('.' + k for k in sorted(kinds))}"
        )


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo.experiment import Case, format_table, plot_memory, run_gst3d_experiment
    from .demo.seed_gst3d import seed_gst3d
    from .units import to_bytes

    to_bytes(args.memory_limit, what="--memory-limit")
    if args.size < DEMO_MIN_SIZE:
        raise MemchunkError(f"--size must be at least {DEMO_MIN_SIZE}, got {args.size}")
    _check_plot_path(args.plot)
    shape = (args.size,) * 3
    cluster = f"LocalCluster(n_workers=2, threads_per_worker=1, memory_limit={args.memory_limit!r})"
    print(f"GST3D dip on a synthetic {shape} float32 volume, {cluster}, fresh for each run.\n")
    # memchunk first: its first plan is the one that measures a self-calibrating function
    cases = [Case("memchunk", None), Case("dask auto", "auto")]
    parts = [
        (
            "1. The seed project's GST3D as a user writes it: NumPy gradients and smoothing, "
            "np.linalg.eigh per voxel (~240 B per voxel). No memory model written: memchunk "
            "measures the function in a worker on its first plan (plan s).",
            seed_gst3d,
            "seed",
        ),
        (
            "2. memchunk's built-in GST3D: one fused task per chunk, one compiled sweep per "
            "block (~10-27 B per padded voxel), calibrated and shipped with the package.",
            "gst3d",
            "built-in",
        ),
    ]
    outcomes = []
    for text, operator, tag in parts:
        print(text, flush=True)
        found = run_gst3d_experiment(
            shape, memory_limit=args.memory_limit, cases=cases, operator=operator
        )
        for outcome in found:
            outcome.label = f"{tag}: {outcome.label}"
        print(format_table(found, args.memory_limit), "\n", flush=True)
        outcomes += found
    try:
        print(f"worker memory over time: {plot_memory(outcomes, args.memory_limit, args.plot)}")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'xarray-memchunk[demo]')")
    memchunk = [o for o in outcomes if o.label.endswith("memchunk")]
    return 0 if all(o.completed and not o.pauses and not o.worker_deaths for o in memchunk) else 1


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .measure.calibrate import calibrate
    from .models.calibration import calibration_dir
    from .operators.arguments import float_dtype

    if args.forget:
        return _forget(args.op, args.option)
    kwargs = _op_kwargs(args.op, args.option)
    dtypes = tuple(args.dtype or ("float32", "float64"))
    for dtype in dtypes:
        float_dtype(dtype, "--dtype")
    _at_least_one(args.repeats, "--repeats")
    fits = calibrate(
        args.op,
        dtypes=dtypes,
        repeats=args.repeats,
        directory=args.output_dir,
        device=args.device,
        **kwargs,
    )
    for dtype, fit in fits.items():
        stats = fit["fit"]
        print(
            f"{args.op} {dtype}: median |error| {stats['median_abs_pct_error']:.1f}%, worst "
            f"under-prediction {stats['worst_under_pct']:.1f}% over {stats['n_profiles']} shapes"
        )
    print(f"saved in {args.output_dir or calibration_dir()}")
    return 0


def _forget(op: str, options: list[str] | None) -> int:
    """Delete what runs taught about ``op`` (with these ``-o`` options); say what was removed.

    ``op`` is a registered operator's name, or a calibration key as a report's note names it:
    a user's function is known by its name and a digest of its code (``neg_fix-a393ea350d1a``),
    its options included. A name that is neither is refused (exit 2).
    """
    from .measure.calibrate import calibration_key
    from .models.learned import forget_learned, learned_path
    from .operators import operator_names

    if op in operator_names():
        key = calibration_key(op, _op_kwargs(op, options))
    elif any(learned_path(op, device).is_file() for device in ("cpu", "gpu")):
        if options:
            raise MemchunkError(
                f"{op!r} is a calibration key: its options are part of it, give no -o"
            )
        key = op
    else:
        raise MemchunkError(
            f"unknown operator or calibration key {op!r}: give an operator's name "
            f"(memchunk operators) or the key a report names (NAME-DIGEST)"
        )
    removed = forget_learned(key)
    if not removed:
        print(f"nothing learned about {op} to forget")
    for path in removed:
        print(f"forgot {path}")
    return 0


def _cmd_operators(args: argparse.Namespace) -> int:
    from .operators import get_operator, operator_names

    for name in operator_names():
        print(f"{name:<12} {get_operator(name).description}")
    return 0


def main(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """Entry point of the ``memchunk`` console script.

    ``exiting``: the process ends when it returns (the console script): after an interrupt its
    stderr stays silenced, so that a cluster cut short prints nothing more as it ends.
    """
    with interrupts.handled(exiting):
        try:
            status = _main(argv)
        except KeyboardInterrupt as exc:
            return interrupts.report(exc, written=getattr(exc, "written", None))
        caught = interrupts.received()  # a library caught it, and the command went on
        return interrupts.report(caught) if caught is not None else status


def _main(argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run its command; bad input is one line on stderr and status 2."""
    import xarray_memchunk  # noqa: F401  (registers the accessor)

    args = _build_parser().parse_args(argv)
    # Zarr v3 stores get consolidated metadata (fast to open) with a warning that it is not in
    # the v3 specification yet; a command line has nothing to do with it
    warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
    commands = {
        "plan": _cmd_plan,
        "run": _cmd_run,
        "ingest": _cmd_ingest,
        "demo": _cmd_demo,
        "calibrate": _cmd_calibrate,
        "operators": _cmd_operators,
    }
    try:
        return commands[args.command](args)
    except MemchunkError as exc:
        print(f"memchunk: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(exiting=True))
