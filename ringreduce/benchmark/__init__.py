"""The benchmark (``python -m ringreduce.bench``): a layer on top of the public API.

It owns how a job is launched and joined (launch.py: torchrun, Open MPI, MPICH,
Slurm, or its own processes), its flags and their checks (options.py), the two
references it compares against (references.py), one measured row (measure.py), the
table, JSON and plot (report.py), ``--host-profile`` (profile.py), and the command
line (cli.py); beside it, the workloads the GPU suites run: DDP training three ways
(dlrm.py) of a DLRM-style model (dlrm_model.py) or a transformer with many buckets
(transformer_model.py; what training needs of either in workloads.py), and sharded
embeddings (sharded_embedding.py), and the exact inputs every check uses (exact.py). The
library never imports it; it reads the engine only through the Communicator and its
flight record.
"""
