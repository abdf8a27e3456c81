"""The result of planning: chosen chunks, predicted peak per task, and why."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import ClassVar

from .budget import Budget
from .problem import Halo, describe_halo

__all__ = ["Binding", "ChunkPlan"]


class Binding:
    """Names of the constraint that decided a plan (the values of :attr:`ChunkPlan.binding`)."""

    MEMORY = "memory"
    PARALLELISM = "parallelism"
    TASK_OVERHEAD = "task overhead"
    STORAGE_ALIGNMENT = "storage alignment"
    USER_CHUNKS = "user chunks"
    MODEL_RANGE = "measured range"
    MAX_TASKS = "max tasks"
    WHOLE_DIMS = "whole dims"

    DESCRIPTIONS: ClassVar[dict[str, str]] = {
        MEMORY: "the per-task memory budget: larger chunks would not fit",
        PARALLELISM: "parallelism: chunks are split so every thread (or core, where threads "
        "share fewer cores) has work; some chunking of fewer tasks fits the budget too",
        TASK_OVERHEAD: "per-task overhead: fewer, larger chunks are faster and fit in memory",
        STORAGE_ALIGNMENT: "storage alignment: whole storage chunks per task, at little cost",
        USER_CHUNKS: "the chunks were given by the user",
        MODEL_RANGE: "the memory model's measured range: larger chunks would go beyond the "
        "largest task it was measured on (calibrating it on larger blocks widens it)",
        MAX_TASKS: "the most chunks a plan may have (the dask config key memchunk.max-tasks): "
        "smaller chunks would fit, but a graph of more takes long to build and schedule",
        WHOLE_DIMS: "the operator needs every planned dim whole: one chunk is the only chunking",
    }


#: One line per row label of :meth:`ChunkPlan.explain`, shown when the pointer rests on a label
#: of the plan's HTML repr (the glossary of the docs says more).
ROW_HELP = {
    "operator": "what runs on each planned chunk",
    "chunks": "the planned chunks: per dim, how many and the longest",
    "tasks": "the operator's tasks: one per planned chunk",
    "peak": "what one task slot (a worker thread) is predicted to hold at its peak",
    "task": "the operator's own work on one chunk, from its memory model",
    "gathering": "getting the input: pieces concatenated, or storage chunks decoded",
    "held": "input chunks a worker keeps in memory while the task runs",
    "factors": "what the operator keeps from every chunk until a later step",
    "producing": "what making the input's block in a Dask graph adds",
    "graph": "Dask's record of each graph task a worker is given",
    "runtime": "compiled code a worker loads with its first task and keeps",
    "budget": "the most one task slot may hold, and the arithmetic behind it",
    "binding": "the constraint that decided the chunks",
    "whole": "dims the operator needs in one chunk",
    "halo": "elements each task reads from its neighbours' chunks",
    "storage": "the input's chunks as stored, and whether planned chunks are made of them",
    "estimate": "estimated wall time, used to rank chunkings",
    "note": "where the model comes from, how the input is read, what was given up",
    "writing": "how to write the result to Zarr",
}

#: What each term of the predicted peak is, as :meth:`ChunkPlan.explain` defines it.
_TASK = "the operator's own work on one chunk, halo included (its memory model)"
_GATHERING = (
    "its input concatenated from pieces (a halo, merged chunks) or decoded from the storage "
    "chunks it reads"
)
_HELD = (
    "input chunks a worker keeps in memory for each of its threads while the task runs "
    "(produced ahead, cut by a rechunk, a stencil's neighbours)"
)
_FACTORS = "what the operator keeps from every chunk until a later step, per thread"
_PRODUCING = "what making a block of the input's Dask graph adds to the task's own peak"
_GRAPH = (
    "Dask's record of each graph task a worker is given (its state, key and run spec): each "
    "thread's share of them"
)
_RUNTIME = (
    "compiled code a worker loads with its first task and keeps: each thread's share of it "
    "(the worker loads it once)"
)


@dataclass(frozen=True)
class ChunkPlan:
    """How an operator's input will be chunked, and what one task is predicted to need.

    Attributes
    ----------
    operator
        Operator name.
    dims
        Dims of the planned array, in order.
    chunks
        Longest chunk per dim (what ``.chunk()`` takes as an int).
    dask_chunks
        Balanced chunk lengths per dim (what ``.chunk()`` takes as a tuple).
    predicted_peak_bytes
        Predicted memory of one task slot while the operator runs: its task
        (``predicted_task_bytes``), getting its input (``gather_bytes``: concatenated from
        pieces, or read from a file), the input chunks a worker holds for it (``held_bytes``),
        the operator's factors held beside it (``factors_bytes``), making a graph's block
        (``produce_bytes``), Dask's record of the graph's tasks (``graph_bytes``) and the
        compiled code a worker loads (``runtime_bytes``); this is what must fit
        ``budget.per_task``.
    budget
        The per-task memory budget planned against.
    n_chunks
        Chunks of the planned array: tasks of the operator's blockwise step (the graph has more:
        reading, halos, a reduction's combine steps).
    binding
        Which constraint decided the chunks (see :class:`Binding`).
    halo
        Halo depth per dim, elements per side or ``(before, after)`` (dims without a halo are
        absent).
    whole_dims
        Dims the operator needs in one chunk.
    storage_chunks
        Storage chunk length per dim, where known.
    storage_aligned
        Whether every chunk is a whole number of storage chunks.
    storage_staged
        Whether ``storage_chunks`` are those of the temporary Zarr store ``apply`` stages the
        data in first, not the input's own.
    predicted_task_bytes
        Predicted peak of the operator's task itself (halo and temporaries included), from its
        memory model.
    gather_bytes
        Extra bytes for getting the task's input: concatenating it from pieces (a halo, merged
        chunks), or reading it from a file (the storage chunks being decoded).
    held_bytes
        Input chunks a worker holds per thread while the task runs (produced ahead, cut by a
        rechunk, waiting for a stencil's neighbours); see
        :mod:`~xarray_memchunk.planning.footprint`.
    factors_bytes
        Factors the operator keeps from every chunk until a later step (the two-pass tsqr's
        ``n x n`` factors), all on one worker, per thread.
    produce_bytes
        What making a block of a graph's input adds to the task's own peak (measured).
    graph_bytes
        Dask's record of the graph tasks a worker is given (their state, key and run spec), per
        thread: every task that slices a ready source chunk is sent at once.
    runtime_bytes
        Compiled code (Numba's runtime) a worker loads with its first task of the operator and
        keeps, per thread.
    estimated_seconds
        Estimated wall time of the blockwise step, from the calibrated time per element and a
        1 ms per-task overhead; used to rank plans, not a promise.
    notes
        Further remarks (alignment given up, method chosen, ...).
    """

    operator: str
    dims: tuple[str, ...]
    chunks: dict[str, int]
    dask_chunks: dict[str, tuple[int, ...]]
    predicted_peak_bytes: int
    budget: Budget
    n_chunks: int
    binding: str
    halo: dict[str, Halo] = field(default_factory=dict)
    whole_dims: tuple[str, ...] = ()
    storage_chunks: dict[str, int | None] = field(default_factory=dict)
    storage_aligned: bool = True
    storage_staged: bool = False
    estimated_seconds: float = math.nan
    notes: tuple[str, ...] = ()
    predicted_task_bytes: int = 0
    gather_bytes: int = 0
    held_bytes: int = 0
    factors_bytes: int = 0
    produce_bytes: int = 0
    graph_bytes: int = 0
    runtime_bytes: int = 0

    @property
    def fits(self) -> bool:
        """Whether the predicted peak of one task is within the per-task budget."""
        return self.predicted_peak_bytes <= self.budget.per_task

    def _chunk_text(self) -> str:
        parts = []
        for dim in self.dims:
            lengths = self.dask_chunks[dim]
            parts.append(f"{dim}: {len(lengths)} x {self.chunks[dim]}")
        return ", ".join(parts) + " (planned; per dim: number of chunks x longest chunk)"

    def _peak_rows(self) -> list[tuple[str, str]]:
        """The predicted peak, and each of its terms on a row of its own, defined there."""
        share = f"{100 * self.predicted_peak_bytes / self.budget.per_task:.0f}% of budget"

        def said(meaning: str) -> str:
            """The term's meaning, said of this process where it runs the tasks (no cluster)."""
            if not self.budget.threaded_scheduler:
                return meaning
            meaning = meaning.replace(" (the worker loads it once)", "")
            return meaning.replace("a worker", "this process")

        terms = [
            (f"  {name}", f"{self.budget.format(nbytes)}: {said(meaning)}")
            for name, nbytes, meaning in (
                ("task", self.predicted_task_bytes, _TASK),
                ("gathering", self.gather_bytes, _GATHERING),
                ("held", self.held_bytes, _HELD),
                ("factors", self.factors_bytes, _FACTORS),
                ("producing", self.produce_bytes, _PRODUCING),
                ("graph", self.graph_bytes, _GRAPH),
                ("runtime", self.runtime_bytes, _RUNTIME),
            )
            if nbytes or name == "task"
        ]
        peak = f"{self.budget.format(self.predicted_peak_bytes)} predicted per task ({share})"
        if len(terms) == 1:
            return [("peak", peak)]
        return [("peak", f"{peak}, the sum of:"), *terms]

    def _lines(self) -> list[tuple[str, str]]:
        binding = Binding.DESCRIPTIONS.get(self.binding, self.binding)
        rows = [
            ("operator", self.operator),
            ("chunks", self._chunk_text()),
            (
                "tasks",
                f"{self.n_chunks}: one task of the operator per planned chunk (the graph has "
                f"more: reading, halos, combining)",
            ),
            *self._peak_rows(),
            ("budget", self.budget.explain()),
            ("binding", f"{binding} (plan.binding = {self.binding!r})"),
        ]
        if self.whole_dims:
            them = "it" if len(self.whole_dims) == 1 else "each"
            rows.append(
                (
                    "whole",
                    f"{', '.join(self.whole_dims)}: one chunk along {them} (the operator needs "
                    f"{them} whole in every task)",
                )
            )
        if self.halo:
            halos = ", ".join(f"{d}: {describe_halo(k)}" for d, k in self.halo.items())
            rows.append(("halo", halos))
        known = {d: c for d, c in self.storage_chunks.items() if c}
        if known:
            state = (
                "aligned: each planned chunk is whole storage chunks"
                if self.storage_aligned
                else "not aligned: planned chunks cut them"
            )
            whose = (
                "the chunks of the temporary Zarr store apply stages the data in first"
                if self.storage_staged
                else "the input's storage chunks: on disk, else in its Dask graph"
            )
            rows.append(
                (
                    "storage",
                    ", ".join(f"{d}: {c}" for d, c in known.items()) + f" ({whose}; {state})",
                )
            )
        if not math.isnan(self.estimated_seconds):
            seconds = f"{self.estimated_seconds:.3g} s"
            rows.append(("estimate", f"{seconds} (ranks chunkings; not a forecast)"))
        rows.extend(("note", note) for note in self.notes)
        irregular = self._irregular_dims()
        if irregular:
            rows.append(
                (
                    "writing",
                    f"chunks along {', '.join(irregular)} are not the regular ones Zarr stores "
                    f"(all equal but the last, which is no larger): write the result with "
                    f"result.memchunk.to_zarr(path), which makes them uniform, not "
                    f"result.to_zarr(path)",
                )
            )
        return rows

    def _irregular_dims(self) -> list[str]:
        """Dims whose planned chunks Zarr cannot store as they are."""
        return [
            dim
            for dim in self.dims
            if len(set(self.dask_chunks[dim][:-1])) > 1
            or self.dask_chunks[dim][-1] > self.dask_chunks[dim][0]
        ]

    def explain(self) -> str:
        """Describe the plan in plain text: chunks, tasks, predicted peak, budget and why."""
        width = max(len(k) for k, _ in self._lines())
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self._lines())

    def __str__(self) -> str:
        return self.explain()

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left{_indent(k)}' "
            f"title='{html.escape(ROW_HELP.get(k.strip(), ''), quote=True)}'>"
            f"{html.escape(k.strip())}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in self._lines()
        )
        status = "fits" if self.fits else "EXCEEDS BUDGET"
        return (
            f"<div><strong>memchunk ChunkPlan</strong> ({html.escape(status)})"
            f"<table>{rows}</table></div>"
        )


def _indent(label: str) -> str:
    """CSS that indents a row whose label is indented (a term of the row above)."""
    return ";padding-left:1.5em;font-weight:normal" if label.startswith(" ") else ""
