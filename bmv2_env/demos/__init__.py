"""The demos on top of everything: the allreduce demo (``inagg-allreduce-demo``) and the MLP
training demo (``inagg-demo``, ``make demo``)."""
