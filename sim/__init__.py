"""Plain-Python side: golden models, simulation runner, demonstrations and benchmarks.

Nothing here imports a simulator at module level; cocotb is only imported inside the
runner when a simulation is started.
"""
