"""Safety: nothing wrong is ever returned as a result, and nothing hangs.

``checks`` refuses bad input before any communication (ValueError/TypeError with the
value and the fix); ``guard`` poisons a Communicator after its first failure and checks,
with ``RINGREDUCE_DEBUG=1``, that every rank makes the same call; ``watchdog`` turns a
stuck or failed CUDA operation into RingReduceError within the deadline, naming the
stage and the peers (``watched``: what it is handed to watch); ``flight`` keeps the
last operations for the failure's dump.
"""
