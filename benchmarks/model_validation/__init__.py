"""The performance model (ringreduce.model) checked against this repository's measurements.

Not part of the library (issue 39: the wheel holds the library only): it reads the committed
``benchmarks/results/`` (the faithful rows priced without a fit: :mod:`.faithful`), so it
runs from a checkout: ``python -m benchmarks.model_validation`` (see ``__main__``).
"""
