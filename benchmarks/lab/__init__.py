"""The benchmark lab: what the commands in ``benchmarks/speed/`` and ``benchmarks/quality/`` share (models, sampling,
timing, results and the command skeleton, modes, the other caches, forecasters, prices, the trained models, the
allocation tracker). Nothing here imports a command or anything in ``tests/``; see ``benchmarks/README.md``."""
