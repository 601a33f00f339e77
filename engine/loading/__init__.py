"""A checkpoint, from its folder to the arrays the networks read.

:mod:`.config` reads its runtime configuration, :mod:`.layout` is the published tensor layout,
:mod:`.checkpoint` finds, verifies and reads the files, :mod:`.tokenizer` the text and RN-T vocabularies,
:mod:`.precast` and :mod:`.memory` decide what is cast once at load and what fits, and
:mod:`.random_checkpoint` writes random-weight checkpoints in the published layout.
"""
