"""End to end: ``parley run`` equals mlx-vlm 0.7.10's streaming session driven the same way.

Same checkpoint, same 16 kHz input (an espeak-ng question plus silence, > 60 frames),
same seed and system prompt: text ids, function ids and the 31 codes of every frame
are identical, the user transcript is identical, and the waveform's max-abs
difference is measured (it is 0.0 on this CPU).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.run import run_audio, write_dump
from engine.model import load_voicechat
from tests.conftest import PARITY_CHECKPOINTS, parity_id
from tests.reference import load_reference, reference_session

pytestmark = pytest.mark.parity

PROMPTS = {"no-prompt": None, "prompt": "Be concise and answer in one sentence."}


@pytest.fixture(scope="module")
def conversation(speech_16k: np.ndarray) -> np.ndarray:
    """The question, its trailing silence and 1.5 s more: 60 full frames and a partial one."""
    return np.concatenate([speech_16k, np.zeros(24_000, dtype=np.float32)])


def run_reference(path, samples: np.ndarray, *, system_prompt: str | None, seed: int) -> dict:
    """Drive the reference session as its realtime server does: pieces of at most 1280 samples, then flush."""
    import mlx.core as mx

    model, processor = load_reference(path)
    session = reference_session(path).create_streaming_session(system_prompt=system_prompt, seed=seed)
    events = []
    for start in range(0, samples.shape[0], 1280):
        events += session.push_audio(mx.array(samples[start : start + 1280]), sample_rate=16_000)
    events += session.flush(pad_partial=True)
    audio = [e for e in events if e.kind == "audio"]
    transcript = [e.text for e in events if e.kind == "user_transcript_delta"]
    prompt_steps = len(session._text_tokens) - len(audio)  # the reference keeps prompt steps in its histories
    return {
        "text_ids": np.array(session._text_tokens[prompt_steps:], dtype=np.int32),
        "function_ids": np.array(session._function_tokens[prompt_steps:], dtype=np.int32),
        "codes": np.stack([np.array(e.audio_codes, dtype=np.int32) for e in audio]),
        "waveform": np.concatenate([np.array(e.samples, dtype=np.float32) for e in audio]),
        "transcript": transcript[-1] if transcript else "",
        "text": [e.text for e in events if e.kind == "assistant_text_delta"],
        "function": [e.text for e in events if e.kind == "function_delta"],
        "processor": processor,
        "model": model,
    }


@pytest.mark.parametrize("prompt", PROMPTS, ids=list(PROMPTS))
@pytest.mark.parametrize("params", PARITY_CHECKPOINTS, ids=parity_id)
def test_run_equals_reference_streaming_session(checkpoint_factory, conversation, params, prompt, tmp_path):
    quantize, seed = params
    path = checkpoint_factory(quantize, seed)
    system_prompt = PROMPTS[prompt]
    ours = run_audio(load_voicechat(path), conversation, system_prompt=system_prompt, seed=seed)
    ref = run_reference(path, conversation, system_prompt=system_prompt, seed=seed)

    frames = ref["codes"].shape[0]
    assert frames == ours.audio_codes.shape[0] == 61
    np.testing.assert_array_equal(ours.text_ids, ref["text_ids"])
    np.testing.assert_array_equal(ours.function_ids, ref["function_ids"])
    np.testing.assert_array_equal(ours.audio_codes, ref["codes"])
    assert ours.user_transcript == ref["transcript"]
    assert ours.assistant_text == (ref["text"][-1] if ref["text"] else "")
    assert ours.function_text == (ref["function"][-1] if ref["function"] else "")

    # Our flush adds the codec's final 8 samples, which the reference drops.
    assert ours.waveform.shape[0] == ref["waveform"].shape[0] + 8 == frames * 1764 + 8
    drift = float(np.max(np.abs(ours.waveform[: ref["waveform"].shape[0]] - ref["waveform"])))
    print(f"waveform max-abs vs mlx-vlm ({parity_id(params)}, {prompt}): {drift:.3g}")
    assert drift <= 1e-5

    # The outputs are not degenerate: the model spoke, changed its mind, and used its channels.
    assert len(set(ours.text_ids.tolist())) > 5
    assert len({tuple(c) for c in ours.audio_codes.tolist()}) > frames // 2
    assert float(np.abs(ours.waveform).max()) > 1e-3

    dumped = write_dump(ours, tmp_path / "dump")
    assert np.array_equal(np.load(tmp_path / "dump" / "audio_codes.npy"), ref["codes"])
    assert {p.name for p in dumped} >= {"text_ids.npy", "function_ids.npy", "waveform.npy", "summary.json"}
