"""Building blocks that both the networks and the kernels use: the attention caches and the draws.

They sit below :mod:`engine.kernels` and :mod:`engine.networks` (a kernel may store into a cache or draw as the
reference does; a network composes them), and import nothing from either.

* :mod:`.cache`: the attention caches (full and sliding window) and their masks.
* :mod:`.sampling`: the MaskGIT rounds' and the MoG head's draws, in the reference's RNG order.
"""
