"""Fast mode's custom kernels, each beside its operations fallback (see docs/numerics.md).

Each module holds one kernel's CUDA and Metal sources, the operations it replaces (the fallback, which the CPU
runs) and the sample inputs it is admitted on. :mod:`.admission` builds a kernel from its sources and uses it only
where it matched its fallback on this device; :mod:`.source` is what differs between a kernel's CUDA and Metal text.
"""
