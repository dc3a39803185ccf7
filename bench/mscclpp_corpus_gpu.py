"""MSCCL++ DSL plans on GPUs, each checked against NCCL on the same input: one rank per GPU, one job for all plans.

    python -m torch.distributed.run --nproc_per_node 2 bench/mscclpp_corpus_gpu.py OUT.json PLAN.json ...

Every rank loads every plan, runs it at each size (bf16, random normal input) and compares with NCCL's result
(``executor.gpu.bench.matches``; ``sendrecv``, which NCCL has no collective for, against NCCL's all-gather's slice
of the previous rank). A plan with port channels runs on the port engine (``executor.port.engine``, NCCL
point-to-point; launch the ranks as several hosts with ``WEFT_HOST``), any other on the CUDA IPC interpreter. A plan
the executor refuses is recorded with its one-line reason on every rank (tables are built from the plan alone, so
every rank refuses alike). Rank 0 writes OUT.json: ``{machine, versions, rows: [{plan, collective, size, ok, us,
error}]}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (64 * 1024, 4 << 20)


def main() -> None:
    import torch
    import torch.distributed as dist

    from executor.gpu.bench import matches, nccl_result, sum_magnitude
    from executor.gpu.bootstrap import all_gather_plain
    from executor.gpu.engine import InterpreterEngine
    from executor.port.engine import PortEngine
    from schedules.collectives import facts_of
    from schedules.plan.io import load_plan
    from weftcore.errors import WeftError

    out_path, files = sys.argv[1], sys.argv[2:]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))))
    # every rank runs the same plans in order, so each engine starts on all alike
    engines: dict[bool, InterpreterEngine | PortEngine] = {}

    def reference(collective: str, x):
        if not facts_of(collective).shifts:
            return nccl_result(collective, x, world), sum_magnitude(collective, x, world)
        every = torch.empty(world * x.numel(), device=x.device, dtype=x.dtype)
        dist.all_gather_into_tensor(every, x)
        return every.view(world, -1)[(rank - 1) % world].clone(), None

    rows = []
    for f in files:
        plan = load_plan(f)
        port = any(g.port_peers for g in plan.gpus)
        if port not in engines:
            engines[port] = (PortEngine if port else InterpreterEngine).from_process_group(timeout_s=10.0)
        comm = engines[port]
        for nbytes in SIZES:
            row = {
                "plan": Path(f).name,
                "collective": plan.collective,
                "size": nbytes,
                "ok": False,
                "us": None,
                "engine": "port" if port else "ipc",
                "error": "",
            }
            try:
                if not plan.accepts(nbytes):
                    raise WeftError(f"size {nbytes} not accepted")
                gpu = plan.gpus[rank]
                n_in = gpu.input_chunks * plan.chunk_bytes(nbytes) // 2
                torch.manual_seed(rank)
                x = torch.randn(n_in, device="cuda", dtype=torch.float32).to(torch.bfloat16)
                ref, magnitude = reference(plan.collective, x)
                n_out = gpu.output_chunks * plan.chunk_bytes(nbytes) // 2
                at_in, at_out = plan.inplace_offsets(rank, n_in, n_out) if plan.inplace else (0, 0)
                if plan.inplace:  # one buffer in and out: the smaller of input and output is the rank's slice
                    buf = torch.zeros(max(n_in, n_out), device="cuda", dtype=torch.bfloat16)
                    buf[at_in : at_in + n_in] = x
                    x = buf
                got = comm.execute(plan, x, dtype="bf16")
                comm.synchronize()
                got = got.reshape(-1)[at_out : at_out + n_out]
                ok = matches(plan.collective, got, ref, "bf16", magnitude, world)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(10):
                    comm.execute(plan, x)
                end.record()
                comm.synchronize()
                row.update(ok=bool(ok), us=start.elapsed_time(end) * 100)
            except (WeftError, RuntimeError) as e:
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            oks = all_gather_plain(bool(row["ok"]))  # plain data, never a pickle
            row["ok"] = all(oks)
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    if rank == 0:
        doc = {
            "machine": torch.cuda.get_device_name(0),
            "gpus": world,
            "date": time.strftime("%Y-%m-%d"),
            "hosts": os.environ.get("WEFT_HOSTS_NOTE", ""),
            "versions": {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))},
            "dtype": "bf16",
            "rows": rows,
        }
        Path(out_path).write_text(json.dumps(doc, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
