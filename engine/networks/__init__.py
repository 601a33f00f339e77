"""The VoiceChat networks, one module each, and the layers they share (no state: the session holds it).

* :mod:`.perception`: streaming log-mel features and the cache-aware FastConformer (its fast form beside them).
* :mod:`.rnnt`: the RN-T predictor and joint (the user's transcript), and its fast form.
* :mod:`.llm` and :mod:`.ssm`: Nemotron-H, its attention blocks and its Mamba-2 mixers.
* :mod:`.tts` and :mod:`.subword`: EAR-TTS — the Gemma-3 backbone, the character-aware subword encoder and the
  MoG head (their draws are :mod:`engine.ops.sampling`).
* :mod:`.codec`: the codec decoder (residual-VQ codes to samples), and its fast form.
* :mod:`.linear` and :mod:`.fused`: the projections and the stacked projections the networks above are built
  from (the attention caches are :mod:`engine.ops.cache`).
"""
