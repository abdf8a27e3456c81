"""Exact SVD of a tall-and-skinny Dask array in two passes, holding only ``n x n`` factors.

``dask.array.linalg.svd`` (tsqr) makes one pass: every block's ``Q`` factor, as large as the
block in float64, waits in memory until the QR of the stacked ``R`` factors is done, so its
workers hold the whole matrix in float64 at once. :func:`two_pass_svd` holds only the small
factors between two passes over the input:

1. each block ``A_i`` gives its ``R_i`` (``n x n``) and forgets its ``Q``;
2. a binary tree of QRs of pairs of ``R`` factors reduces them to one ``R``, keeping each
   node's ``Q`` (LAPACK's ``tpqrt``: an ``n x n`` triangle of reflectors); the SVD of that
   ``R`` gives ``S``, ``V`` and ``U_R``;
3. down the tree, each node's ``Q`` times its ``M`` (``U_R`` at the root) gives its children's
   ``M``; a leaf's ``M_i`` (``n x n``) is its block's share of ``Q_tree U_R``;
4. the second pass reads each block again (its graph is cloned, bound to the end of step 3,
   so Dask recomputes it instead of holding it), recomputes its QR and applies its ``Q`` to
   ``M_i``: ``U_i = Q_i M_i`` (``scipy.linalg.qr_multiply``).

This is tsqr's algorithm with its accuracy (``U`` from orthogonal factors, not from
``A V / S``), for twice the block QRs and two reads of the input. Each QR is computed in
float64 (complex128), as NumPy's are; the factors between tasks are kept in the input's
dtype, as the result is (float32 factors for float32 data: errors of a few float32 roundings,
measured 1e-7 on ``U^T U - I``).

It is right only if the second QR of a block equals the first. LAPACK is deterministic for
the same input, call and threads, but where a column is nearly dependent on the previous ones
a Householder sign can flip between two different calls (measured: ``scipy.linalg.qr(mode="r")``
against ``qr_multiply`` on a block with two equal columns), which would silently corrupt
``U``. So both passes make the same LAPACK call, each block's first ``R`` leaves a
fingerprint (``R_i w`` for a fixed random ``w``) and the second pass compares it: a difference
raises :class:`~xarray_memchunk.MemchunkError` instead of returning a wrong ``U``.

Memory: a pass's task holds its block, its float64 copy and the product ``U_i`` in float64
(20 bytes per float32 element); the tree's and the SVD's tasks a few ``n x n`` matrices.
Between the passes the tree's factors are held (:func:`held_bytes_per_block`): each node's
``Q`` until the walk down uses it, then each leaf's ``M`` until the second pass does. A walk
down step frees one ``Q`` and one ``M`` and makes two ``M``, so the count never grows past the
nodes' ``Q`` factors plus one ``M``. ``R`` factors are not held: each node consumes its
children's, and the fingerprints travel with them (they were held, one ``R`` per block until
the second pass, when the fingerprints were a task of their own). Blocks are planned at least
``n`` rows tall (``min_length``), so that every NumPy node takes ``tpqrt``.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import numpy as np

from ...errors import MemchunkError
from ..arrays import array_module

__all__ = ["held_bytes_per_block", "two_pass_svd"]

#: Block size of LAPACK's ``tpqrt`` (its ``nb``): 64 was the fastest of 32, 64 and 128.
TSQR_BLOCK = 64
#: Largest relative difference between a block's two ``R`` fingerprints that is taken as
#: rounding (the same QR run twice gives 0 on one machine).
FINGERPRINT_RTOL = 1e-10
_FINGERPRINT_SEED = 20261122


def held_bytes_per_block(n: int, dtype: np.dtype, dense: bool) -> float:
    """Bytes of the tree's factors held between the passes, per block of the input.

    Parameters
    ----------
    n
        Columns of the matrix (its shorter side).
    dtype
        The input's dtype, in which the factors are kept.
    dense
        Whether the tree's nodes take a dense QR (CuPy): their ``Q`` is ``2n x n``, against
        ``tpqrt``'s ``n x n`` triangle and ``TSQR_BLOCK x n`` block factor (NumPy, blocks of
        at least ``n`` rows).

    Notes
    -----
    With ``B`` blocks the tree has ``B - 1`` nodes, and at most their ``Q`` factors and one
    ``M`` (``n x n``) are held at once (see the module docstring), each block's fingerprint
    (``n`` values in the compute dtype) beside them. This bounds ``B`` times the returned
    bytes; measured with 8 and 16 blocks (60000 x 2000 float32 on 2 workers), the factors
    held on one worker peaked at 0.64 to 0.77 ``n x n`` per block.
    """
    itemsize = np.dtype(dtype).itemsize
    node = 2 * n * n if dense else n * n + min(TSQR_BLOCK, n) * n
    return float(node * itemsize + n * compute_dtype(dtype).itemsize)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float64 or complex128: LAPACK's precision for the factors of any float input."""
    return np.result_type(dtype, np.float64)


def _weights(n: int, xp: Any) -> Any:
    """The fixed random vector of :func:`_fingerprint`."""
    return xp.asarray(np.random.default_rng(_FINGERPRINT_SEED).standard_normal(n))


def _fingerprint(r: Any) -> Any:
    """``R w``: a row whose sign or values differ gives a different vector."""
    xp = array_module(r)
    return r @ _weights(r.shape[1], xp)


def _r_factor(block: Any, work: np.dtype, store: np.dtype) -> tuple[Any, tuple[Any]]:
    """``R`` of a block's QR computed in ``work``, kept in ``store`` (``Q`` is not formed).

    Returns ``(R, (fingerprint,))``: the fingerprint travels up and down the tree with the
    factors, so that no task keeps ``R`` for it until the second pass.
    """
    xp = array_module(block)
    factored = xp.array(block, dtype=work, order="F", copy=True)  # LAPACK overwrites it
    if xp is np:
        import scipy.linalg

        # the call qr_multiply makes in the second pass: the same LAPACK path, the same R
        (factored, _), _ = scipy.linalg.qr(
            factored, mode="raw", overwrite_a=True, check_finite=False
        )
        r = np.triu(factored[: min(factored.shape)]).astype(store)
    else:
        r = xp.linalg.qr(factored, mode="r").astype(store)
    return r, (_fingerprint(r),)


def _qr_node(work: np.dtype, upper_item: tuple, lower_item: tuple) -> tuple[tuple, tuple]:
    """QR of two stacked ``R`` factors, computed in ``work``, in their dtype.

    Two square triangles (NumPy) take LAPACK's triangular-pentagonal QR (``tpqrt``), whose
    ``Q`` is an ``n x n`` triangle of reflectors and a ``TSQR_BLOCK x n`` matrix: half the
    memory of a dense ``2n x n`` ``Q`` and a ninth of the time (measured at n = 2000). Other
    pairs (a block shorter than ``n``, CuPy) get a dense QR. ``Q`` is ``("tp", V, T)`` or
    ``("dense", Q)``.

    Each item is ``(R, fingerprints)`` (those of the blocks below it, in order). Returns
    ``((Q, len(upper fingerprints)), (R, all fingerprints))``: the node's part for the walk
    down and its item for the level above.
    """
    (upper, upper_prints), (lower, lower_prints) = upper_item, lower_item
    prints = upper_prints + lower_prints
    split = len(upper_prints)
    xp = array_module(upper)
    store = upper.dtype
    n = upper.shape[1]
    if xp is np and upper.shape == lower.shape == (n, n):
        from scipy.linalg import get_lapack_funcs

        tpqrt = get_lapack_funcs("tpqrt", (np.empty(0, dtype=work),))
        r, v, t, info = tpqrt(
            n,
            min(TSQR_BLOCK, n),
            np.asarray(upper, dtype=work, order="F"),
            np.asarray(lower, dtype=work, order="F"),
            overwrite_a=True,
            overwrite_b=True,
        )
        if info != 0:
            raise MemchunkError(f"LAPACK tpqrt failed (info={info}) in the two-pass tsqr")
        q = ("tp", v.astype(store), t.astype(store))
        return (q, split), (np.triu(r).astype(store), prints)
    q, r = xp.linalg.qr(xp.concatenate((upper, lower)).astype(work))
    return (("dense", q.astype(store)), split), (r.astype(store), prints)


def _svd_root(work: np.dtype, item: tuple) -> tuple[tuple, Any, Any]:
    """SVD of the last ``R``, computed in ``work``: ``((U_R, fingerprints), S, V^H)``."""
    r, prints = item
    xp = array_module(r)
    u, s, vh = xp.linalg.svd(r.astype(work), full_matrices=False)
    return (u.astype(r.dtype), prints), s.astype(r.real.dtype), vh.astype(r.dtype)


def _down(work: np.dtype, node: tuple, item: tuple, rows: tuple[int, ...]) -> list[tuple]:
    """Each child's ``(M, fingerprints)``: its rows of the node's ``Q`` times the node's ``M``.

    Computed in ``work``; the fingerprints are split as the node's children hold them.
    """
    q, split = node
    m, prints = item
    children = (prints[:split], prints[split:])
    store = m.dtype
    if q[0] == "tp":  # Q [M; 0] from the reflectors, as tpqrt left them
        from scipy.linalg import get_lapack_funcs

        _, v, t = q
        tpmqrt = get_lapack_funcs("tpmqrt", (np.empty(0, dtype=work),))
        top, bottom, info = tpmqrt(
            v.shape[0],
            np.asarray(v, dtype=work, order="F"),
            np.asarray(t, dtype=work, order="F"),
            np.asarray(m, dtype=work, order="F"),
            np.zeros(v.shape, dtype=work, order="F"),
            overwrite_a=True,
            overwrite_b=True,
        )
        if info != 0:
            raise MemchunkError(f"LAPACK tpmqrt failed (info={info}) in the two-pass tsqr")
        return list(zip((top.astype(store), bottom.astype(store)), children, strict=True))
    product = (q[1].astype(work) @ m.astype(work)).astype(store)
    edges = np.cumsum((0, *rows))
    parts = [product[a:b] for a, b in itertools.pairwise(edges)]
    return list(zip(parts, children, strict=True))


def _u_block(block: Any, item: tuple, work: np.dtype) -> Any:
    """``Q_i M_i`` from the block's QR, recomputed; refused when its ``R`` changed.

    Holds the block, its copy in ``work`` (overwritten by the QR) and the product in ``work``
    (20 bytes per float32 element); the copy is freed before the product is cast back.
    ``item`` is the block's ``(M, (fingerprint,))`` from the walk down.
    """
    m, (fingerprint,) = item
    xp = array_module(block)
    factored = xp.array(block, dtype=work, order="F", copy=True)  # LAPACK overwrites it
    if xp is np:
        import scipy.linalg

        product, r = scipy.linalg.qr_multiply(
            factored, m.astype(work), mode="left", overwrite_a=True
        )
    else:
        q, r = xp.linalg.qr(factored)
        product = q @ m.astype(work)
        del q
    del factored
    again = _fingerprint(r.astype(m.dtype))  # as the first pass kept it
    scale = float(xp.linalg.norm(r)) * float(xp.linalg.norm(_weights(r.shape[1], xp)))
    difference = float(xp.max(xp.abs(again - fingerprint))) if again.size else 0.0
    if difference > FINGERPRINT_RTOL * max(scale, np.finfo(np.float64).tiny):
        raise MemchunkError(
            f"two-pass tsqr: the second QR of a {block.shape[0]}x{block.shape[1]} block differs "
            f"from the first (relative difference {difference / scale:.1e}), so its U would be "
            f"wrong. LAPACK gave different results for the same block: run the workers with one "
            f"BLAS thread (OMP_NUM_THREADS=1), or use tsqr='one-pass' or method='compressed'"
        )
    return product.astype(block.dtype, copy=False)


def two_pass_svd(a: Any) -> tuple[Any, Any, Any]:
    """Exact thin SVD ``a = U diag(S) V^H`` of a tall Dask array chunked along rows only.

    Parameters
    ----------
    a
        Dask array of shape ``(m, n)``, ``m >= n``, one chunk across the columns.

    Returns
    -------
    u, s, vh
        Dask arrays: ``U`` (``m x n``, chunked as ``a``), ``S`` (``n``) and ``V^H``
        (``n x n``), in ``a``'s dtype (float32 stays float32, as NumPy's SVD returns it).
    """
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    m, n = a.shape
    if a.numblocks[1] != 1 or m < n:
        raise ValueError(f"two_pass_svd needs a tall array in row blocks, got {a.chunks}")
    token = tokenize(a, "two-pass-svd")
    work, store = compute_dtype(a.dtype), np.dtype(a.dtype)
    meta = a._meta
    rows = tuple(min(c, n) for c in a.chunks[0])
    first = f"tsqr-r-{token}"
    r_factors = da.Array(
        HighLevelGraph.from_collections(
            first,
            {(first, i, 0): (_r_factor, (a.name, i, 0), work, store) for i in range(len(rows))},
            dependencies=[a],
        ),
        first,
        chunks=(rows, (n,)),
        meta=meta,
    )
    tree, leaves, root = _tree_tasks(first, rows, n, token, work)
    name = f"tsqr-tree-{token}"
    graph = HighLevelGraph.from_collections(name, tree, dependencies=[r_factors])

    def part(label: str, keys: dict, chunks: tuple, like: Any) -> Any:
        layer = f"tsqr-{label}-{token}"
        tasks = {(layer, *index): key for index, key in keys.items()}
        layers = {**graph.layers, layer: tasks}
        dependencies = {**graph.dependencies, layer: {name}}
        return da.Array(HighLevelGraph(layers, dependencies), layer, chunks=chunks, meta=like)

    m_leaves = part("m", {(i, 0): k for i, k in enumerate(leaves)}, (rows, (n,)), meta)
    s = part("s", {(0,): (operator.getitem, root, 1)}, ((n,),), meta.real.reshape(-1)[:0])
    vh = part("vh", {(0, 0): (operator.getitem, root, 2)}, ((n,), (n,)), meta)
    # the second pass reads the input again, after the tree: Dask must not hold it meanwhile
    again = produced_again(a, after=m_leaves, seed=token)
    u = da.map_blocks(_u_block, again, m_leaves, work, chunks=a.chunks, dtype=store, meta=meta)
    return u, s, vh


def produced_again(a: Any, after: Any, seed: str) -> Any:
    """A copy of ``a`` under new keys, every task of its graph run anew once ``after`` is done.

    What ``dask.graph_manipulation.bind(a, after)`` is for. It cannot be used here: it copies
    a layer of ``Task`` objects (e.g. the ``reshape`` of ``xarray``'s ``stack``) without
    renaming the keys inside them (dask/dask#12455), so the copy's tasks still depend on the
    original input blocks, and Dask holds them between the passes (measured: a worker held
    320 MB of a 640 MB float64 input beside the tree). This copy renames every key, and the
    tasks without dependencies wait on ``after``, so that none runs before it. Literal data in
    the graph (blocks of an array given to ``from_array``) is in the copy too, as ``bind``
    copies it: the graph carries it twice, and no worker holds it between the passes.

    Parameters
    ----------
    a
        Dask array whose graph is copied (materialized: one task per block per layer).
    after
        Dask collection that every copied task waits for.
    seed
        Makes the new keys (:func:`dask.base.clone_key`).
    """
    import dask.array as da
    from dask.base import clone_key
    from dask.core import flatten
    from dask.graph_manipulation import checkpoint, chunks
    from dask.highlevelgraph import HighLevelGraph

    from ..._dask_compat import Task, TaskRef, convert_legacy_graph, cull

    # the tasks that a's blocks need, and only those
    graph = cull(convert_legacy_graph(dict(a.__dask_graph__())), list(flatten(a.__dask_keys__())))
    blocker = checkpoint(after)
    renamed = {key: clone_key(key, seed) for key in graph}
    copied = {}
    for key, new in renamed.items():
        node = graph[key].substitute(renamed, key=new)
        if not node.dependencies:  # the others wait through these (and fuse as they did)
            node = Task(new, chunks.bind, node, TaskRef(blocker.key))
        copied[new] = node
    name = clone_key(a.name, seed)
    layers = HighLevelGraph.from_collections(name, copied, dependencies=[blocker])
    return da.Array(layers, name, chunks=a.chunks, dtype=a.dtype, meta=a._meta)


def _tree_tasks(first: str, rows: tuple[int, ...], n: int, token: str, work: np.dtype):
    """Tasks of the tree (up: QR of pairs of R; root: SVD; down: M per child).

    Returns the tasks, the key of each leaf's ``M`` and the key of the root's SVD.
    """
    tasks: dict = {}
    level = [((first, i, 0), h) for i, h in enumerate(rows)]
    nodes: list[list[tuple[Any, tuple[int, ...]]]] = []  # per level: (node key or None, rows)
    depth = 0
    while len(level) > 1:
        above, here = [], []
        for j in range(0, len(level), 2):
            pair = level[j : j + 2]
            if len(pair) == 1:  # an odd one passes through
                above.append(pair[0])
                here.append((None, (pair[0][1],)))
                continue
            key = (f"tsqr-node-{token}", depth, j)
            tasks[key] = (_qr_node, work, *(k for k, _ in pair))
            tasks[(*key, "r")] = (operator.getitem, key, 1)
            tasks[(*key, "q")] = (operator.getitem, key, 0)
            above.append(((*key, "r"), min(sum(h for _, h in pair), n)))
            here.append((key, tuple(h for _, h in pair)))
        nodes.append(here)
        level, depth = above, depth + 1
    root = (f"tsqr-svd-{token}",)
    tasks[root] = (_svd_root, work, level[0][0])
    tasks[(*root, "u")] = (operator.getitem, root, 0)
    ms: list[Any] = [(*root, "u")]
    for here in reversed(nodes):
        children = []
        for (key, heights), m_key in zip(here, ms, strict=True):
            if key is None:
                children.append(m_key)
                continue
            down = (*key, "down")
            tasks[down] = (_down, work, (*key, "q"), m_key, heights)
            for c in range(len(heights)):
                tasks[(*down, c)] = (operator.getitem, down, c)
                children.append((*down, c))
        ms = children
    return tasks, ms, root
