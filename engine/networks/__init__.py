"""The VoiceChat networks, one module or package each, and the layers they share (no state: the session holds it).

A network with a fast form keeps it beside its math (``<network>/fast.py``) and chooses it itself
(``use_numerics(plan)``); :mod:`engine.numerics` only decides the plan.

* :mod:`.perception` (a package): streaming log-mel features and the cache-aware FastConformer, and its fast form
  (:mod:`.perception.fast`).
* :mod:`.rnnt` (a package): the RN-T predictor and joint (the user's transcript), and its fast form.
* :mod:`.llm` (a package): Nemotron-H, its attention blocks and its Mamba-2 mixers (the scan in :mod:`.llm.ssm`),
  its state and its fast form (:mod:`.llm.fast`).
* :mod:`.tts` (a package): EAR-TTS — the Gemma-3 backbone, the character-aware subword encoder, the MoG head (their
  draws are :mod:`engine.ops.sampling`), its state and its fast form (:mod:`.tts.fast`).
* :mod:`.codec` (a package): the codec decoder (residual-VQ codes to samples), and its fast form.
* :mod:`.linear` and :mod:`.fused`: the projections and the stacked projections the networks above are built
  from (the attention caches are :mod:`engine.ops.cache`).
"""
