"""PyTorch's own distributed tests (``DistributedTest._DistTestBase``) against ringreduce.

``python -m tests.torch_suite --backend ringreduce --backend gloo --json out.json`` runs a
selection of the cases torch ships in ``torch.testing._internal.distributed.
distributed_test`` on each backend (4 ranks as 2 virtual machines x 2, hierarchy forced)
and fails when a case the reference backend passes does not pass on ringreduce and is not
in ``expected.NOT_PASSED``. ``selection.py`` (pure) holds the name patterns and that list;
``cases.py`` is imported only by the worker and its ranks, with the suite's environment
set (torch's module reads ``BACKEND`` at import); ``worker.py`` runs one backend's share of
the cases; ``__main__.py`` is the driver.
"""
