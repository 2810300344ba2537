"""Replaying a recorded trace on a backend (`ccbench replay`): `rank` is what every rank runs
(each call measured with the benchmark's method, then the whole sequence), `extra` prepares
the calls ccbench's collectives do not cover (gather, scatter, all-to-all-v, send/recv ...)
on the backend. The trace itself comes from `ccbench.formats.load_trace`.
"""
