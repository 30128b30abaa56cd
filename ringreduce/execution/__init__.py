"""Execution: turning a plan into work on streams, NCCL communicators and kernels.

``resources`` builds a Communicator's streams, events, buffers and watchdog, and
``cuda_setup`` its NCCL communicators (and closes or aborts them); ``issue`` turns a
checked call into work (CUDA issue, the native issuer, the CPU worker, Futures),
``memory_order`` keeps calls on the same memory in issue order;
``pipeline`` walks a call's steps on the named stage streams; ``transport``
issues each stage over NCCL (the ``nccl`` package, the only code that calls NCCL from
Python), ``gloo_transport`` over gloo; ``add`` and ``kernels`` run the add stage
(torch ops, or native/*.cu via cupy); ``one_slice`` issues a call as three
collectives, ``probe`` chooses between it and the pipeline; ``native`` records a call once and
replays it from C++ (native/issuer.cpp); ``collectives`` builds reduce-scatter and
all-gather from the same stages.
"""
