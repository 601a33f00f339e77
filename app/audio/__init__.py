"""Real audio, one responsibility a module.

- ``devices``: which microphones and speakers there are (the sound server's, else PortAudio's), PortAudio itself.
- ``endpoint``: one open stream, opening and closing it, PortAudio's clocks.
- ``frames``: the microphone's reader side, device-rate ring to exact engine frames.
- ``output``: the speaker's chain after the jitter buffer: gain (volume × ducking) and the limiter.
- ``replay``: a history replay mixed into the speaker.
- ``streams``: :class:`~app.audio.streams.AudioIO`, the two streams, their lifecycle and hot-plug.
"""
