"""codegen: lowers a Schedule into an execution Plan (MSCCL++ plan JSON) and exports MSCCL XML."""
