"""The plan registry: verified plans keyed by topology, collective, rank count and message-size range.

A layer of its own, between the formats (schedules/, codegen/, synth/) and the runtimes (executor/, weft/): it
imports schedules (and the base package weftcore), and executor/ and weft/ import it, never the other way round.
``registry.store`` holds the registry itself (entries, commits, selection); ``registry.index`` the index rows that
selection reads without parsing a plan. Users write ``weft.Registry``.
"""
