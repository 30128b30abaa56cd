"""Integrations: the three ways users reach the engine besides a Communicator itself.

``hook`` is DDP's comm hook (``ddp_model.register_comm_hook(comm, ringreduce.ddp_hook)``),
``backend`` the ``"ringreduce"`` torch.distributed backend (``dispatch``: where it sends a
call; ``work``: the Work its engine calls return), and ``api`` the standalone
``ringreduce.all_reduce`` with a cached Communicator per group. ``hsdp`` is the
replicate all-reduce hook that ``ringreduce.fsdp.apply`` installs for custom HSDP.
``buckets`` keys error feedback per model (DDP buckets, FSDP hooks), ``regroup`` reduces
DDP's first buckets after a resume in the saved layouts, ``resume`` checks a saved
``Communicator.state_dict()`` against the Communicator it is loaded into.
"""
