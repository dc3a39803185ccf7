"""The GPU interpreter runtime: device tables, the CUDA interpreter kernel (cuda/), its build, IPC and bootstrap."""
