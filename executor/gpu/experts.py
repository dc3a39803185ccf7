"""The expert-parallel exchange of a capacity-padded MoE layer on one host: dispatch and combine as one kernel each
(``executor/gpu/cuda/experts.cu``), over CUDA IPC, reading and writing the layer's own rows.

The layer (GShard and Tutel's, as ``examples/moe_routing.py`` states it): each of ``ranks`` ranks holds ``tokens``
rows of ``hidden`` elements and ``experts / ranks`` of the experts, numbered rank-major. Each token claims
``top_k`` experts; a claim that found a place has the dispatch row ``expert * capacity + place``, and a dropped
one the trash row ``experts * capacity``. With all-to-all, a rank fills a dispatch buffer of those rows, exchanges
it, reorders what it received expert-major, runs its experts, reorders their outputs rank-major, exchanges them
back and sums each token's rows by its gates: four copies and a weighted sum around the two exchanges. Here:

- **dispatch** copies each kept claim's token row straight into the expert's rank's receive buffer, at
  ``ExpertLayout.received_row``: expert-major, (local expert, source rank, place), which is what the experts'
  batched matmul reads;
- **combine** copies each expert output row (the matmul's output, in the same order) straight back into its source
  rank's return buffer at the claim's dispatch row (``ExpertLayout.returned_row``), then sums every token's kept
  rows weighted by their gates in fp32, ``(0 + row0 * gate0) + row1 * gate1``, and rounds once to the element type:
  the same operations, in the same order, as torch's gather, multiply and sum over the two claims, so the output
  is bit for bit the all-to-all path's (tests/gpu/test_experts_gpu.py checks it against NCCL's).

``reference_dispatch`` and ``reference_combine`` state the same on numpy arrays of every rank; tests/test_experts.py
checks them against the all-to-all path of ``examples/moe_routing.py``.

Arrival: a flag per (phase, source rank) on every rank holds the count of that phase's launches, stored by the
source's last block after its rows (a system-scope release after a fence); a rank waits where it needs its peers'
rows. Every wait gives up after ``timeout_s``, and the next ``check`` raises ExecutorTimeout naming the rank and the
peer. A rank reuses its buffers safely because the phases alternate: a peer writes this rank's receive buffer for
the next layer only after this rank's combine of the last one reached it, which follows this rank's experts, and
writes its return buffer only after this rank's next dispatch reached it, which follows this rank's sums. Every rank
must therefore call dispatch and combine alternately, the same number of times, in one stream order (a graph
replay is a call of each captured kernel).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor.errors import ExecutorError, ExecutorTimeout
from executor.gpu import ipc
from executor.gpu import launch as gpu_launch
from executor.gpu.build import resident_blocks, source_dir
from executor.gpu.engine import HOST_ALLOC_PORTABLE_MAPPED
from executor.gpu.tables import DTYPE_BYTES

SOURCE = "experts.cu"
VECTOR = 16  # bytes each thread moves at once; a row must be a whole number of them
THREADS = 512
STATE_WORDS = 8  # experts.cu's state words, padded
ERROR_WORDS = 4  # (set, phase + 1, rank, source rank)
PHASES = ("dispatch", "combine")


@dataclass(frozen=True)
class ExpertLayout:
    """One MoE layer's shape on ``ranks`` ranks, and where each row goes."""

    ranks: int
    experts: int
    capacity: int
    tokens: int
    hidden: int
    dtype: str = "bf16"
    top_k: int = 2

    @property
    def local(self) -> int:
        """Experts on each rank."""
        return self.experts // self.ranks

    @property
    def trash(self) -> int:
        """The dispatch row of a dropped claim (rows ``0 .. trash - 1`` are the experts' places)."""
        return self.experts * self.capacity

    @property
    def held(self) -> int:
        """Rows each rank's experts receive: (local expert, source rank, place)."""
        return self.local * self.ranks * self.capacity

    @property
    def row_bytes(self) -> int:
        return self.hidden * DTYPE_BYTES[self.dtype]

    def refusal(self) -> str:
        """Why the fused kernels cannot run this layer, or ''."""
        if self.dtype not in DTYPE_BYTES:
            return f"dtype {self.dtype} is not one of {', '.join(DTYPE_BYTES)}"
        if min(self.ranks, self.experts, self.capacity, self.tokens, self.hidden, self.top_k) < 1:
            return "ranks, experts, capacity, tokens, hidden and top_k must be positive"
        if self.experts % self.ranks:
            return f"{self.experts} experts do not split evenly over {self.ranks} ranks"
        if self.row_bytes % VECTOR:
            return f"a row of {self.hidden} {self.dtype} elements is not a multiple of {VECTOR} bytes"
        return ""

    def received_row(self, source: int, row: int) -> tuple[int, int]:
        """(rank, row of its receive buffer) where dispatch writes the claim of ``source`` at dispatch ``row``."""
        expert, place = divmod(row, self.capacity)
        rank, local = divmod(expert, self.local)
        return rank, (local * self.ranks + source) * self.capacity + place

    def returned_row(self, owner: int, held: int) -> tuple[int, int]:
        """(rank, row of its return buffer) where combine writes row ``held`` of ``owner``'s expert outputs."""
        local, rest = divmod(held, self.ranks * self.capacity)
        source, place = divmod(rest, self.capacity)
        return source, (owner * self.local + local) * self.capacity + place


def reference_dispatch(layout: ExpertLayout, xs: list[np.ndarray], rows: list[np.ndarray]) -> list[np.ndarray]:
    """Every rank's receive buffer ((local, ranks * capacity, hidden)) after dispatch, on numpy arrays: ``xs[r]``
    is rank r's tokens (tokens, hidden) and ``rows[r]`` its claims' dispatch rows (tokens, top_k). Rows no claim
    wrote are zero here (the kernel leaves what was there: only written rows are read back)."""
    received = [np.zeros((layout.held, layout.hidden), xs[0].dtype) for _ in range(layout.ranks)]
    for source in range(layout.ranks):
        for t, claims in enumerate(rows[source]):
            for row in claims:
                if 0 <= row < layout.trash:
                    rank, at = layout.received_row(source, int(row))
                    received[rank][at] = xs[source][t]
    return [r.reshape(layout.local, layout.ranks * layout.capacity, layout.hidden) for r in received]


def reference_combine(
    layout: ExpertLayout, done: list[np.ndarray], rows: list[np.ndarray], gates: list[np.ndarray]
) -> list[np.ndarray]:
    """Every rank's output (tokens, hidden) in fp32 before rounding, after combine: ``done[r]`` is rank r's expert
    outputs in its receive buffer's order, ``gates[r]`` its claims' gates (tokens, top_k)."""
    returned = [np.zeros((layout.trash, layout.hidden), np.float32) for _ in range(layout.ranks)]
    for owner in range(layout.ranks):
        for held, row in enumerate(done[owner].reshape(layout.held, layout.hidden)):
            source, at = layout.returned_row(owner, held)
            returned[source][at] = row
    out = []
    for source in range(layout.ranks):
        acc = np.zeros((layout.tokens, layout.hidden), np.float32)
        for j in range(layout.top_k):
            kept = (rows[source][:, j] >= 0) & (rows[source][:, j] < layout.trash)
            picked = returned[source][np.where(kept, rows[source][:, j], 0)]
            weights = (gates[source][:, j] * kept).astype(np.float32)
            acc = acc + picked * weights[:, None]
        out.append(acc)
    return out


@dataclass(frozen=True)
class Claims:
    """A call's claims as the kernels read them: the dispatch rows (int64) and gates (fp32), with their strides in
    elements (token, choice), so that a transposed view needs no copy."""

    rows: int
    rows_strides: tuple[int, int]
    gates: int = 0
    gates_strides: tuple[int, int] = (0, 0)

    def arguments(self, gates: bool = False) -> tuple:
        """The kernels' (rows, its two strides), then with ``gates`` (gates, its two strides)."""
        pairs = ((self.rows, self.rows_strides), *(((self.gates, self.gates_strides),) if gates else ()))
        return tuple(v for address, (t, c) in pairs for v in (np.uint64(address), np.int64(t), np.int64(c)))


class ExpertExchange:
    """The fused dispatch and combine of one ``ExpertLayout`` on this rank (collective to create: every rank of the
    layer makes one, in the same order). It owns the receive buffer that dispatch fills (``received``) and the return
    buffer combine reads; the caller passes device addresses and a stream handle."""

    def __init__(
        self,
        layout: ExpertLayout,
        rank: int,
        device: int,
        exchange: Callable[[str, Any], list],
        timeout_s: float = 30.0,
    ):
        """``exchange(what, value)``: every rank's plain ``value`` in rank order (the engine's ``exchange``)."""
        import cupy

        self.layout, self.rank, self.device, self.timeout_s = layout, rank, device, timeout_s
        self._cupy = cupy
        self._peers = ipc.PeerMappings()
        self._error_host = 0
        why, shares = layout.refusal(), None
        try:  # each rank's own steps first; then every rank learns whether all of them could
            if not why:
                shares = self._allocate(cupy)
        except Exception as e:  # an NVRTC failure, out of memory, an allocation IPC cannot share
            why = f"rank {rank}: {e}"
        shared = exchange("experts", {"why": why, "shares": shares})
        why = next((s["why"] for s in shared if s["why"]), "")
        if why:
            self.close()
            raise ExecutorError(f"executor: expert exchange: {why}")
        with cupy.cuda.Device(device):  # each buffer's address on every rank, in rank order
            mine = {"received": self._received, "returned": self._returned, "flags": self._flags}
            self._tables = {
                k: cupy.asarray(
                    np.asarray(
                        [v.data.ptr if r == rank else self._peers.open(s["shares"][k]) for r, s in enumerate(shared)],
                        np.uint64,
                    )
                )
                for k, v in mine.items()
            }
            cupy.cuda.runtime.deviceSynchronize()
        self._launcher = gpu_launch.Launcher(programmatic=False)
        exchange("experts-ready", None)  # no peer writes here before every rank mapped every buffer

    def _allocate(self, cupy: Any) -> dict[str, ipc.SharedBuffer]:
        """Compile the kernels, allocate this rank's buffers, and export the ones peers write."""
        lay, device = self.layout, self.device
        with cupy.cuda.Device(device):
            module = cupy.RawModule(
                code=(source_dir() / SOURCE).read_text(),
                backend="nvrtc",
                options=("-std=c++17", f"--gpu-architecture=sm_{cupy.cuda.Device(device).compute_capability}"),
            )
            self._dispatch = module.get_function("weft_experts_dispatch")
            self._combine = module.get_function(f"weft_experts_combine_{lay.dtype}")
            # combine's blocks wait for each other's rows: all of them must be resident at once, one an SM at most
            sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
            fits = min(resident_blocks(self._combine, THREADS, device), int(sms))
            self._combine_grid = max(1, min(max(lay.held, lay.tokens), fits))
            self._dispatch_grid = max(1, min(lay.tokens * lay.top_k, fits))
            self._received = cupy.zeros(lay.held * lay.row_bytes, cupy.uint8)
            self._returned = cupy.zeros(lay.trash * lay.row_bytes, cupy.uint8)
            self._flags = cupy.zeros(len(PHASES) * lay.ranks, cupy.uint64)
            self._state = cupy.zeros(STATE_WORDS, cupy.uint64)
            self._error_host = cupy.cuda.runtime.hostAlloc(4 * ERROR_WORDS, HOST_ALLOC_PORTABLE_MAPPED)
            self._error = np.ctypeslib.as_array((ctypes.c_int32 * ERROR_WORDS).from_address(self._error_host))
            self._error[:] = 0
            cupy.cuda.runtime.deviceSynchronize()  # zeroed before any peer can write
            shared = {"received": self._received, "returned": self._returned, "flags": self._flags}
            return {k: ipc.export(v.data.ptr) for k, v in shared.items()}

    @property
    def received(self) -> Any:
        """The receive buffer (a CuPy uint8 array): ``held`` rows of ``row_bytes``, (local expert, source rank,
        place)."""
        return self._received

    def _common(self) -> tuple:
        lay = self.layout
        return (
            self._flags,
            self._state,
            np.uint64(self._error_host),
            np.uint64(int(self.timeout_s * 1e9)),
            np.int32(self.rank),
            np.int32(lay.ranks),
            np.int32(lay.local),
            np.int32(lay.capacity),
            np.int32(lay.row_bytes // VECTOR),
        )

    def _launch(self, kernel: Any, grid: int, args: tuple, stream: int) -> None:
        function = getattr(kernel, "kernel", kernel).ptr
        self._launcher.prepare(function, grid, THREADS, gpu_launch.Arguments.pack(args))(stream)

    def dispatch(self, x: int, claims: Claims, stream: int) -> None:
        """Copy every kept claim's row of ``x`` (tokens rows of ``row_bytes``, 16-byte aligned) into its expert's
        rank's receive buffer; returns (on the stream) when every rank's rows for this rank have arrived."""
        lay = self.layout
        args = (
            np.uint64(x),
            *claims.arguments(),
            np.int32(lay.tokens),
            np.int32(lay.top_k),
            self._tables["received"],
            self._tables["flags"],
            *self._common(),
        )
        self._launch(self._dispatch, self._dispatch_grid, args, stream)

    def combine(self, done: int, claims: Claims, out: int, stream: int) -> None:
        """Send every expert output row of ``done`` (the receive buffer's order) back to its source rank, then write
        each token's gate-weighted sum of its kept rows into ``out`` (tokens rows of ``row_bytes``)."""
        lay = self.layout
        args = (
            np.uint64(done),
            *claims.arguments(gates=True),
            np.uint64(out),
            self._returned,
            np.int32(lay.tokens),
            np.int32(lay.top_k),
            self._tables["returned"],
            self._tables["flags"],
            *self._common(),
        )
        self._launch(self._combine, self._combine_grid, args, stream)

    def failure(self) -> str:
        """What a wait that timed out recorded, as one line, or '' (reads the host-mapped record; no sync)."""
        set_, phase, rank, source = (int(w) for w in self._error)
        if not set_:
            return ""
        return (
            f"executor: rank {rank}: expert exchange {PHASES[phase - 1]}: the rows of rank {source} did not arrive "
            f"within {self.timeout_s:g} s (a rank stopped, or the ranks called dispatch and combine unequally often)"
        )

    def check(self) -> None:
        """Synchronize this device and raise ExecutorTimeout if any wait of this exchange timed out. The flags and
        epochs then stay as they were: make a new exchange on every rank to go on."""
        self._cupy.cuda.runtime.deviceSynchronize()
        why = self.failure()
        if why:
            raise ExecutorTimeout(why, int(self._error[2]), peer=int(self._error[3]))

    def close(self) -> None:
        self._peers.close()
        if self._error_host:
            self._cupy.cuda.runtime.freeHost(self._error_host)
            self._error_host = 0
