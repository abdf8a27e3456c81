"""Every private or undocumented Dask and distributed API the package relies on, in one place.

The package reads Dask's task graphs (to recognize data read straight from a file, to count a
graph's layers, to find layers that gather neighbour blocks, to copy a graph under new keys)
and distributed's internal state (a worker's threads and stored bytes, a cluster's adaptive
bounds, the scheduler's event messages). None of these is a public API: an upgrade may change
them without notice. Each is wrapped here in a small function whose docstring says what it
relies on, and ``tests/test_dask_compat.py`` runs every one of them against the installed
Dask and distributed, so that an upgrade that breaks an assumption fails there first, not
deep inside a plan.

Checked with dask and distributed :data:`CHECKED_WITH`. Importing this module imports neither
Dask nor distributed: each function imports what it needs, so that an upgrade that removes
one of these APIs breaks what uses it, not the import of the package.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "CHECKED_WITH",
    "FROM_ARRAY_PREFIX",
    "MEMORY_RESTART_TOPIC",
    "NEIGHBOUR_LAYER_PREFIXES",
    "TASK_SPEC_NAMES",
    "WorkerRemoval",
    "adaptive_bounds",
    "alias_target",
    "array_meta",
    "bounded_run",
    "bounded_run_on_scheduler",
    "check_scheduler_address",
    "ensure_minimum_chunksize",
    "first_task_arguments",
    "from_array_source",
    "graph_layers",
    "high_level_graph",
    "is_pause_event",
    "layer_dependencies",
    "layer_tasks",
    "memory_restart",
    "neighbour_gathering_layers",
    "periodic_progress",
    "task_data",
    "worker_device_memory_limit",
    "worker_memory_limit",
    "worker_plugin",
    "worker_removal",
    "worker_stored_bytes",
    "worker_task_bytes",
    "worker_threads",
    "workers_in_this_process",
]

#: The versions every function here was checked with.
CHECKED_WITH = {"dask": "2026.8.0", "distributed": "2026.8.0"}

_logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Task graphs (dask)
# ---------------------------------------------------------------------------------------------

#: Names re-exported from ``dask._task_spec`` (a private module; checked with dask 2026.8.0)
#: for :func:`~xarray_memchunk.operators.svd.tsqr.produced_again`, which copies a graph under
#: new keys: ``convert_legacy_graph`` turns a graph's tuples into ``Task`` nodes, ``cull`` keeps
#: the tasks some keys need, ``Task.substitute(renamed, key=new)`` renames the keys a node
#: refers to, ``Task.dependencies`` is the keys it refers to, and ``Task(key, func, *args)``
#: with a ``TaskRef(key)`` argument makes a task wait for another. Imported when first used
#: (:func:`__getattr__`), so that a Dask without them breaks that function, not the package.
TASK_SPEC_NAMES = ("Task", "TaskRef", "convert_legacy_graph", "cull")


def __getattr__(name: str) -> Any:
    """``Task``, ``TaskRef``, ``convert_legacy_graph`` and ``cull`` of ``dask._task_spec``.

    Parameters
    ----------
    name
        One of :data:`TASK_SPEC_NAMES`.

    Returns
    -------
    Any
        Dask's object of that name.

    Raises
    ------
    AttributeError
        For any other name.
    """
    if name in TASK_SPEC_NAMES:
        import dask._task_spec

        return getattr(dask._task_spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Name prefix of the layer ``dask.array.from_array`` (``inline_array=False``, as
#: ``xarray.open_dataset(..., chunks=...)`` calls it) keeps the source array in.
FROM_ARRAY_PREFIX = "original-"

#: Name prefixes of the layers in which Dask gathers neighbour blocks: ``dask.array.overlap``
#: (behind ``map_overlap``, ``sliding_window_view``, ``gradient``, and xarray's ``rolling``,
#: ``rolling(...).construct`` and ``differentiate`` on Dask data).
NEIGHBOUR_LAYER_PREFIXES = ("overlap-",)


def high_level_graph(collection: Any) -> Any | None:
    """A Dask collection's ``HighLevelGraph``; ``collection`` itself where it is one; or None.

    Relies on ``collection.__dask_graph__()`` being a ``HighLevelGraph``: ``.layers`` maps each
    layer's name (an array's ``.name`` for its last layer) to a mapping of its tasks, and
    ``.dependencies`` each layer's name to the names of the layers it takes blocks from.
    Checked with dask 2026.8.0.

    Parameters
    ----------
    collection
        A Dask collection (a Dask array, an xarray object holding them), its graph, or
        anything.

    Returns
    -------
    HighLevelGraph or None
        None where there is no graph, or a graph without layers (a plain dict of tasks).
    """
    dask_graph = getattr(collection, "__dask_graph__", None)
    graph = dask_graph() if callable(dask_graph) else collection
    if getattr(graph, "layers", None) is None or getattr(graph, "dependencies", None) is None:
        return None
    return graph


def graph_layers(collection: Any) -> Mapping[str, Any]:
    """The layers of a Dask collection's graph (or of a ``HighLevelGraph``), by name.

    See :func:`high_level_graph` for what it relies on. Checked with dask 2026.8.0.

    Parameters
    ----------
    collection
        A Dask collection, its graph, or anything.

    Returns
    -------
    Mapping
        ``{layer name: layer}``; empty where there is no graph or no layers.
    """
    graph = high_level_graph(collection)
    return graph.layers if graph is not None else {}


def layer_dependencies(graph: Any, name: str) -> set[str]:
    """The names of the layers layer ``name`` of a ``HighLevelGraph`` depends on.

    Relies on ``HighLevelGraph.dependencies`` mapping each layer's name to the set of the
    layers' names it takes blocks from. Checked with dask 2026.8.0.

    Parameters
    ----------
    graph
        A ``HighLevelGraph`` (``array.__dask_graph__()``).
    name
        One of its layers.

    Returns
    -------
    set of str
        Empty where ``name`` depends on none (or is not a layer of ``graph``).
    """
    return set(graph.dependencies.get(name, ()))


def layer_tasks(graph: Any, name: str) -> dict[Any, Any]:
    """The tasks of layer ``name`` of a ``HighLevelGraph``, materialized: ``{key: task}``.

    Relies on each of ``HighLevelGraph.layers`` being a mapping of keys to tasks (dask's
    ``Task``, ``Alias`` or ``DataNode`` nodes, or literal values). Checked with dask 2026.8.0.

    Parameters
    ----------
    graph
        A ``HighLevelGraph``.
    name
        One of its layers.

    Returns
    -------
    dict
        Every key of the layer and its task.
    """
    return dict(graph.layers[name])


def task_data(node: Any) -> Any:
    """The literal value a graph node holds: a ``DataNode``'s ``.value``, else ``node`` itself.

    Relies on ``dask._task_spec.DataNode`` (literal data in a graph, e.g. the array
    ``from_array(..., inline_array=True)`` passes to every getter) keeping it in ``.value``.
    Checked with dask 2026.8.0.

    Parameters
    ----------
    node
        A task's argument, or a layer's value.

    Returns
    -------
    Any
        The value.
    """
    from dask._task_spec import DataNode

    return node.value if isinstance(node, DataNode) else node


def first_task_arguments(graph: Any, name: str) -> list[Any]:
    """The arguments of the first task of layer ``name``, literal data unwrapped.

    Relies on a layer's tasks being dask ``Task`` nodes whose ``.args`` hold their arguments
    (``DataNode`` for literal data, :func:`task_data`), as ``from_array(..., inline_array=True)``
    makes them: ``getter(array, index)``. Checked with dask 2026.8.0.

    Parameters
    ----------
    graph
        A ``HighLevelGraph``.
    name
        One of its layers, with at least one task.

    Returns
    -------
    list
        The task's arguments; empty for a task without ``.args``.
    """
    task = next(iter(graph.layers[name].values()))  # the first alone, not the whole layer
    return [task_data(a) for a in getattr(task, "args", ())]


def from_array_source(graph: Any, name: str) -> Any | None:
    """The array ``dask.array.from_array`` reads from, where layer ``name`` is its getters.

    ``xarray.open_dataset(..., chunks=...)`` (and ``open_zarr``, ``open_mfdataset`` for each
    file) calls ``from_array(backend_array, inline_array=False)``: a layer ``original-...``
    holding the backend array alone, and a layer of getter tasks depending on it alone. This
    recognition relies on that layer name (:data:`FROM_ARRAY_PREFIX`) and on the ``original-``
    layer holding the array as its one value. Checked with dask 2026.8.0 and xarray 2026.9.0.

    Parameters
    ----------
    graph
        A ``HighLevelGraph``.
    name
        One of its layers.

    Returns
    -------
    Any or None
        The source array (a NumPy array, for ``from_array`` of one); None where ``name`` is not
        the getters of one ``original-`` layer holding one value.
    """
    dependencies = layer_dependencies(graph, name)
    if len(dependencies) != 1:
        return None
    (original,) = dependencies
    if not str(original).startswith(FROM_ARRAY_PREFIX):
        return None
    values = list(layer_tasks(graph, original).values())
    if len(values) != 1:
        return None
    return task_data(values[0])


def alias_target(value: Any) -> Any:
    """The key a task that only forwards another key's value points to.

    ``dask.array.concatenate`` of arrays whose blocks it takes whole (as ``open_mfdataset``
    makes a variable of several files) maps each of its keys to a block of a part: a key, a
    ``TaskRef`` (``.key``) or an ``Alias`` (``.target``, itself a key or a ``TaskRef``). Relies
    on those attribute names. Checked with dask 2026.8.0.

    Parameters
    ----------
    value
        A task of a layer (:func:`layer_tasks`).

    Returns
    -------
    Any
        The key it points to, or ``value`` itself where it is none of these.
    """
    target = getattr(value, "target", value)
    return getattr(target, "key", target)


def array_meta(array: Any) -> Any:
    """An empty array of a Dask array's block type (NumPy, CuPy...): its ``_meta``.

    Relies on ``dask.array.Array._meta``, an attribute named private that Dask's own
    ``meta_from_array`` and ``map_blocks(meta=...)`` read. Checked with dask 2026.8.0.

    Parameters
    ----------
    array
        A Dask array, or an array without ``_meta`` (NumPy, CuPy).

    Returns
    -------
    Any
        A zero-size array of the block type and dtype; ``array`` itself where it has no
        ``_meta``.
    """
    return getattr(array, "_meta", array)


def ensure_minimum_chunksize(size: int, chunks: Sequence[int]) -> tuple[int, ...]:
    """``chunks`` of one dim with chunks shorter than ``size`` merged into their neighbours.

    What ``map_overlap`` does to chunks shorter than its depth: relies on
    ``dask.array.overlap.ensure_minimum_chunksize`` (not exported by ``dask.array``). Checked
    with dask 2026.8.0.

    Parameters
    ----------
    size
        The shortest chunk allowed.
    chunks
        Chunk lengths along the dim; their sum is at least ``size``.

    Returns
    -------
    tuple of int
        The merged chunks, of the same sum.

    Raises
    ------
    ValueError
        Where the dim is shorter than ``size``.
    """
    from dask.array.overlap import ensure_minimum_chunksize as ensure

    return tuple(int(c) for c in ensure(size, tuple(chunks)))


def neighbour_gathering_layers(collection: Any, inputs: Iterable[str]) -> list[str]:
    """The layers of ``collection``'s graph that gather neighbour blocks of ``inputs``' data.

    Dask gathers the neighbour blocks (halos) of an array in one layer, named ``overlap-...``
    (:data:`NEIGHBOUR_LAYER_PREFIXES`), whatever built it: ``map_overlap``, ``overlap``,
    ``sliding_window_view``, xarray's ``rolling``. Only layers downstream of one of ``inputs``
    (through the graph's layer dependencies) are returned. Relies on those layer names and on
    ``HighLevelGraph.dependencies``; reads layer names only, computes and materializes nothing.
    Checked with dask 2026.8.0 and xarray 2026.9.0.

    Parameters
    ----------
    collection
        A lazy result (a Dask array, an xarray object holding them).
    inputs
        Names of the layers whose data counts (e.g. every layer of a variable read from a
        file).

    Returns
    -------
    list of str
        The gathering layers' names, sorted; empty where there are none, or no graph.
    """
    graph = high_level_graph(collection)
    if graph is None:
        return []
    dependencies = graph.dependencies
    users: dict[str, set[str]] = {}
    for layer, needs in dependencies.items():
        for need in needs:
            users.setdefault(need, set()).add(layer)
    reached: set[str] = set()
    todo = [name for name in inputs if name in dependencies]
    while todo:
        for user in users.get(todo.pop(), ()):
            if user not in reached:
                reached.add(user)
                todo.append(user)
    return sorted(n for n in reached if str(n).startswith(NEIGHBOUR_LAYER_PREFIXES))


# ---------------------------------------------------------------------------------------------
# Workers, clusters and the scheduler (distributed)
# ---------------------------------------------------------------------------------------------

#: Event topic of the nanny when it restarts a worker for its memory (its message's
#: ``"worker"`` is the worker's address): ``distributed.worker_memory``.
MEMORY_RESTART_TOPIC = "worker-restart-memory"


def bounded_run(
    client: Any, function: Callable[[], Any], workers: list[str], timeout: float
) -> dict[str, Any]:
    """``client.run(function, workers=workers, on_error="ignore")``, given up after ``timeout``.

    ``Client.run`` waits for every worker it asks, with no limit: a worker whose process is
    stopped (or wedged) accepts the connection and never answers, and the call waits for
    ever. Relies on ``Client.sync``'s ``callback_timeout`` and on ``Client._run``, the
    coroutine ``Client.run`` runs (internal); a client without them (another implementation)
    is asked with ``client.run``, unbounded. Checked with distributed 2026.8.0.

    Parameters
    ----------
    client
        A synchronous ``distributed.Client``.
    function
        What each worker runs, with no arguments.
    workers
        The workers' addresses.
    timeout
        Seconds.

    Returns
    -------
    dict
        Each answering worker's address and result; a worker whose call failed is left out.

    Raises
    ------
    TimeoutError
        When not every worker answered within ``timeout``.
    """
    run = getattr(client, "_run", None)
    if run is None or not hasattr(client, "sync"):
        return client.run(function, workers=workers, on_error="ignore")
    return client.sync(run, function, workers=workers, on_error="ignore", callback_timeout=timeout)


def bounded_run_on_scheduler(client: Any, function: Callable[..., Any], timeout: float) -> Any:
    """``client.run_on_scheduler(function)``, given up after ``timeout`` seconds.

    Relies on ``Client.sync``'s ``callback_timeout`` and on ``Client._run_on_scheduler``
    (internal), as :func:`bounded_run`; unbounded ``run_on_scheduler`` where the client lacks
    them. Checked with distributed 2026.8.0.

    Raises
    ------
    TimeoutError
        When the scheduler did not answer within ``timeout``.
    """
    run = getattr(client, "_run_on_scheduler", None)
    if run is None or not hasattr(client, "sync"):
        return client.run_on_scheduler(function)
    return client.sync(run, function, callback_timeout=timeout)


def worker_threads(worker: Any) -> int:
    """The threads a ``distributed.Worker`` runs tasks on (1 where it does not say).

    Relies on ``Worker.state`` (the worker's ``WorkerState``, internal) and its ``nthreads``.
    Checked with distributed 2026.8.0.

    Parameters
    ----------
    worker
        The worker (``dask_worker`` in ``client.run``, a plugin's ``setup`` argument).

    Returns
    -------
    int
        At least 1.
    """
    return int(getattr(worker.state, "nthreads", 1) or 1)


def worker_stored_bytes(worker: Any) -> int:
    """Bytes of task results a ``distributed.Worker`` holds in memory now.

    Relies on ``Worker.state.nbytes`` (``WorkerState``, internal: the sum of the sizes of the
    results it keeps in memory, spilled ones excluded). Checked with distributed 2026.8.0.

    Parameters
    ----------
    worker
        The worker.

    Returns
    -------
    int
        Bytes; 0 where the worker does not say.
    """
    return int(getattr(worker.state, "nbytes", 0) or 0)


def worker_task_bytes(worker: Any, key: Any) -> int:
    """Bytes of the result of task ``key`` that a ``distributed.Worker`` holds, as Dask sizes it.

    Relies on ``Worker.state.tasks`` (``WorkerState``, internal: ``TaskState.nbytes`` is set
    when the result is put in memory, before worker plugins hear of the transition). Checked
    with distributed 2026.8.0.

    Parameters
    ----------
    worker
        The worker.
    key
        The task's key.

    Returns
    -------
    int
        Bytes; 0 where the worker does not say.
    """
    task = getattr(worker.state, "tasks", {}).get(key)
    return int(getattr(task, "nbytes", 0) or 0)


def worker_plugin(worker: Any, name: str) -> Any | None:
    """The worker plugin registered on ``worker`` under ``name``, or None.

    Relies on ``Worker.plugins`` (undocumented), a mapping of plugin names to the plugin
    objects ``client.register_plugin`` installed. Checked with distributed 2026.8.0.

    Parameters
    ----------
    worker
        The worker (``dask_worker`` in ``client.run``), or None.
    name
        The plugin's name.

    Returns
    -------
    Any or None
        The plugin object.
    """
    return getattr(worker, "plugins", {}).get(name)


def worker_device_memory_limit(worker: Any) -> int | None:
    """A dask-cuda worker's ``device_memory_limit`` (bytes); None for any other worker.

    Relies on ``Worker.data`` being dask-cuda's ``DeviceHostFile`` (or ``ProxifyHostFile``)
    with a ``device_memory_limit`` attribute. Checked with distributed 2026.8.0 (that a plain
    worker has none).

    Parameters
    ----------
    worker
        The worker.

    Returns
    -------
    int or None
        The limit; None where there is none.
    """
    limit = getattr(worker.data, "device_memory_limit", None)
    return int(limit) if limit else None


def adaptive_bounds(cluster: Any) -> tuple[float, float] | None:
    """The minimum and maximum workers of a cluster's active adaptive scaling, or None.

    ``SpecCluster.adapt`` keeps its ``Adaptive`` in ``cluster._adaptive`` (distributed keeps no
    public handle), with ``.minimum``, ``.maximum`` (``math.inf`` for none) and ``.state``
    (``"stopped"`` once stopped). Checked with distributed 2026.8.0.

    Parameters
    ----------
    cluster
        ``client.cluster``, or None.

    Returns
    -------
    tuple of (float, float) or None
        ``(minimum, maximum)``; None where the cluster does not adapt, or no longer does.
    """
    adaptive = getattr(cluster, "_adaptive", None)
    if adaptive is None or getattr(adaptive, "state", "") == "stopped":
        return None
    return adaptive.minimum, adaptive.maximum


def workers_in_this_process() -> list[Any]:
    """The ``distributed.Worker`` objects of this process that have not closed.

    ``LocalCluster(processes=False)`` starts its workers here; distributed keeps every
    ``Worker`` in the class's weak set ``Worker._instances`` (no public registry), each with a
    ``.status`` whose ``.name`` is ``"closing"``, ``"closed"`` or ``"failed"`` once it stops.
    Checked with distributed 2026.8.0.
    """
    from distributed import Worker

    stopped = ("closing", "closed", "failed")
    return [w for w in list(Worker._instances) if w.status.name not in stopped]


def worker_memory_limit(
    limit: str | float | None,
    nthreads: int,
    total_cores: int | None = None,
    *,
    logger: logging.Logger | None = None,
) -> int | None:
    """A worker's memory limit in bytes, read as the worker reads its ``memory_limit``.

    Relies on ``distributed.worker_memory.parse_memory_limit`` (an internal module): ``"auto"``
    is the machine's memory times ``nthreads / total_cores`` (distributed's default
    ``total_cores`` where None), a string or number of bytes is taken as it is, a fraction of 1
    or less is of the machine's memory, and every limit is capped at the machine's memory.
    Checked with distributed 2026.8.0.

    Parameters
    ----------
    limit
        As ``LocalCluster(memory_limit=...)`` takes it.
    nthreads
        The worker's threads.
    total_cores
        The machine's cores.
    logger
        Where distributed logs that a limit exceeds the machine's memory.

    Returns
    -------
    int or None
        Bytes; None for no limit (0 or None).
    """
    from distributed.worker_memory import parse_memory_limit

    extra = {} if total_cores is None else {"total_cores": total_cores}
    return parse_memory_limit(limit, nthreads, **extra, logger=logger or _logger)


def check_scheduler_address(address: str) -> None:
    """Check that ``address`` names a Dask scheduler (``tcp://HOST:PORT``, ``HOST:PORT``...).

    Relies on ``distributed.comm.addressing.parse_address`` and ``parse_host_port`` and
    ``distributed.comm.registry.get_backend`` (internal modules). Checked with distributed
    2026.8.0.

    Parameters
    ----------
    address
        The address.

    Raises
    ------
    ValueError
        Saying why it is none: an unknown protocol, or a TCP address without a port.
    """
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    scheme, location = parse_address(address)
    get_backend(scheme)
    if scheme in ("tcp", "tls"):
        parse_host_port(location)


def is_pause_event(msg: Any) -> bool:
    """Whether a scheduler event says a worker paused (for its memory).

    Relies on the scheduler's ``worker-status-change`` event (on the worker's topic): a dict
    with ``"action": "worker-status-change"`` and the new ``"status"`` name. Checked with
    distributed 2026.8.0.

    Parameters
    ----------
    msg
        One event's message, from ``client.get_events()``.

    Returns
    -------
    bool
        True for a change to ``"paused"``.
    """
    return (
        isinstance(msg, dict)
        and msg.get("action") == "worker-status-change"
        and msg.get("status") == "paused"
    )


class WorkerRemoval(NamedTuple):
    """A worker the scheduler removed, from its ``remove-worker`` event.

    Attributes
    ----------
    worker
        The worker's address.
    expected
        Whether it was retired on purpose (adaptive scale-down, ``retire_workers``).
    processing
        Keys of the tasks it was running or about to run.
    """

    worker: str
    expected: bool
    processing: tuple[Any, ...]


def worker_removal(topic: str, msg: Any) -> WorkerRemoval | None:
    """The worker an event says the scheduler removed, or None for any other event.

    Relies on the scheduler's ``remove-worker`` event on its ``"all"`` topic: a dict with
    ``"action": "remove-worker"``, ``"worker"``, ``"expected"`` and ``"processing-tasks"``.
    Checked with distributed 2026.8.0.

    Parameters
    ----------
    topic
        The event's topic, from ``client.get_events()``.
    msg
        Its message.

    Returns
    -------
    WorkerRemoval or None
        The removal.
    """
    if topic != "all" or not isinstance(msg, dict) or msg.get("action") != "remove-worker":
        return None
    return WorkerRemoval(
        worker=str(msg.get("worker")),
        expected=bool(msg.get("expected")),
        processing=tuple(msg.get("processing-tasks") or ()),
    )


def memory_restart(topic: str, msg: Any) -> str | None:
    """The worker a nanny restarted for its memory, from its event; None for any other event.

    Relies on the nanny's :data:`MEMORY_RESTART_TOPIC` event, a dict whose ``"worker"`` is the
    worker's address (``distributed.worker_memory.NannyMemoryManager``). Checked with
    distributed 2026.8.0.

    Parameters
    ----------
    topic
        The event's topic.
    msg
        Its message.

    Returns
    -------
    str or None
        The worker's address.
    """
    if topic != MEMORY_RESTART_TOPIC or not isinstance(msg, dict) or not msg.get("worker"):
        return None
    return str(msg["worker"])


def periodic_progress(
    futures: Sequence[Any],
    report: Callable[[float, int, float], None],
    every_s: float,
    *,
    interval: str = "1s",
) -> None:
    """Follow ``futures`` to their end, calling ``report`` at most every ``every_s`` seconds.

    ``report(done, n_tasks, elapsed_s)`` gets the fraction of tasks done, the tasks and the
    seconds since the start; it is called once more when all are done. Blocks until they
    are. Relies on subclassing ``distributed.diagnostics.progressbar.TextProgressBar``
    (undocumented): its ``_draw_bar(remaining, all)``, ``_draw_stop()`` and ``elapsed``.
    Checked with distributed 2026.8.0.

    Parameters
    ----------
    futures
        Futures (or collections) of the active client.
    report
        Called with the progress.
    every_s
        Least seconds between two calls, but for the last.
    interval
        How often the scheduler is asked.
    """
    from distributed.diagnostics.progressbar import TextProgressBar

    class _Periodic(TextProgressBar):
        last = -float(every_s)

        def _draw_bar(self, remaining: int, all: int, **kwargs: Any) -> None:
            done = 1.0 - remaining / all if all else 1.0
            if self.elapsed - self.last >= every_s or remaining == 0:
                self.last = self.elapsed
                report(done, all, self.elapsed)

        def _draw_stop(self, **kwargs: Any) -> None:
            pass

    _Periodic(list(futures), interval=interval)
