"""The benchmarks' workloads, outside the library (the wheel does not ship them): DDP
training three ways (dlrm.py, the modes' options, hooks and engines in dlrm_modes.py, its
command line dlrm_cli.py, run by benchmarks/dlrm.py) of a DLRM-style model
(dlrm_model.py) or a transformer with many buckets (transformer_model.py; what training
needs of either in workloads.py), FSDP2 training of that transformer six ways
(fsdp_train.py, the modes' options, meshes and routing in fsdp_modes.py, its command line
fsdp_cli.py, run by benchmarks/fsdp.py), row-sharded embeddings (sharded_embedding.py),
and the exact inputs every check uses (exact.py; the tests' cases.py and
benchmarks/soak.py). Imported as ``benchmarks.workloads`` with the repository root on
``sys.path``: the scripts in benchmarks/ put it there, pytest does for the tests.
"""
