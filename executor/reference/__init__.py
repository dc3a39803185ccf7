"""The CPU reference executor: runs a Plan for every rank in one process on numpy and proves it."""
