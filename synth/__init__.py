"""Solvers: each module has ``solve(topology, collective, options) -> Schedule`` (or functions per algorithm).

Modules import their heavy solver libraries (z3, OR-Tools) themselves, so that importing ``synth`` is cheap.
"""
