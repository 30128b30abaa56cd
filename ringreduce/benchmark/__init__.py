"""The benchmark (``python -m ringreduce.bench``): a layer on top of the public API.

It owns how a job is launched and joined (launch.py: torchrun, Open MPI, MPICH,
Slurm, or its own processes), its flags and their checks (options.py), the two
references it compares against (references.py), one measured row (measure.py), the
table, JSON and plot (report.py), ``--host-profile`` (profile.py), and the command
line (cli.py). The library never imports it; it reads the engine only through the
Communicator and its flight record.
"""
