"""The benchmark (``python -m ringreduce.bench``): a layer on top of the public API.

It owns how a job is launched and joined (launch.py: torchrun, Open MPI, MPICH, Slurm,
or its own processes), its flags and their checks (options.py), the two references it
compares against (references.py), one measured row (measure.py, with its timed and
checked loops in loops.py), the table, JSON and plot (report.py), ``--host-profile``
(profile.py), the command line (cli.py), and the merge of several runs' JSON
(summary.py). The workloads the GPU suites run (DDP training, sharded embeddings, the
exact inputs of the checks) are not part of the package: benchmarks/workloads/ in the
repository. The library never imports it; it reads the engine only through the
Communicator and its flight record.
"""
