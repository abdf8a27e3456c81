"""Values every task of a layer shares (a function, its arguments, coordinates), once a graph.

Given to ``map_blocks`` as they are, Dask copies such values into every task, and a worker
unpickles each task's copy as it receives the task. A user's function defined in a script or
a notebook is pickled by value, with the globals it reads (a 480 kB lookup table made every
task of a stencil 961 kB); a calendar's time coordinate pickles to about 60 B a step, and
every task's copy, unpickled into small objects, left Python's allocator holding ~0.15 MiB a
task after the run (a plan at a refusal's stated minimum paused its workers for good). Dask
itself puts an argument in the graph once only above 1 MB (``dask.array.core.normalize_arg``).
Here each such value is one key of the graph that the tasks depend on, sent once to each
worker. A small value stays in the tasks: a task with a key among its dependencies is no
longer fused with the task that made its block (Dask's linear fusion), so that a block made
by a graph would wait for the operator as a result of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SHARED_BYTES", "call_with", "holds_collections", "once_in_graph", "task_bytes"]

#: Bytes above which a value every task shares is put in the graph once: a thousand tasks
#: then carry 64 MB less each time a worker receives them.
SHARED_BYTES = 64 * 2**10


def once_in_graph(values: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``values``, those over :data:`SHARED_BYTES` as one key of the graph (``{name}-{key}``).

    A value that holds Dask collections stays as it is: Dask computes them for the tasks.

    Examples
    --------
    >>> import numpy as np
    >>> shared = once_in_graph({"function": abs, "table": np.zeros(10**5)}, "abs-1")
    >>> shared["function"] is abs, shared["table"].key
    (True, 'abs-1-table')
    """
    import dask

    return {
        key: dask.delayed(value, name=f"{name}-{key}", traverse=False)
        if task_bytes(value) > SHARED_BYTES and not holds_collections(value)
        else value
        for key, value in values.items()
    }


def task_bytes(value: Any) -> int:
    """About the bytes ``value`` adds to each task that carries it.

    ``dask.sizeof``, or where that is small, the pickled size: a function defined in a script
    or a notebook goes by value, with the globals it reads, and an object array's objects
    (``cftime`` dates: ~60 B each) are not in its ``nbytes``.
    """
    import cloudpickle
    from dask.sizeof import sizeof

    size = int(sizeof(value))
    if size > SHARED_BYTES:
        return size
    try:
        return max(size, len(cloudpickle.dumps(value)))
    except Exception:  # not picklable: only a scheduler of threads can run it
        return size


def call_with(block: Any, *, function: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
    """``function(block, **arguments)``: a task's call with values :func:`once_in_graph` put."""
    return function(block, **arguments)


def holds_collections(value: Any) -> bool:
    """Whether ``value``, or a value in it (a mapping's, a list's), is a Dask collection."""
    import dask

    if isinstance(value, Mapping):
        return any(holds_collections(v) for v in value.values())
    if isinstance(value, list | tuple | set):
        return any(holds_collections(v) for v in value)
    return dask.is_dask_collection(value)
