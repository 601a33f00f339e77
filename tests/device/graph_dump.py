"""One steady fast frame's graphs as MLX exports them, stage by stage, on the device: where the primitives are.

    python3 tests/device/graph_dump.py OUT_DIR [structure|full] [frame]        on the device
    python3 tests/device/graph_dump.py --read OUT_DIR                          here: the primitives by neighbour

The census (``engine.counters``) counts primitives by kind; this names them. Each stage's graph is written as
``mx.export_to_dot`` writes it (weights first, named by the census's order), and ``--read`` attributes every
primitive that is not a kernel of Parley's to the weights the kernels nearest it read, so that a view, a cast or
a concatenation is found beside the projection it serves. The CPU cannot build the CUDA kernels, so the graph a
GPU evaluates is only seen there.
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections import Counter, defaultdict, deque
from pathlib import Path

_PRIMITIVE = re.compile(r'^\{ (\d+) \[label ="([^"]+)"', re.MULTILINE)
_INPUT_EDGE = re.compile(r'^"([^"]+)" -> (\d+)$', re.MULTILINE)
_OUTPUT_EDGE = re.compile(r'^(\d+) -> "([^"]+)"$', re.MULTILINE)


def dump(out_dir: Path, size: str, frame: int) -> None:
    import mlx.core as mx

    from app.bench import bench_input
    from engine import counters
    from engine.counters import GraphCensus, _dot_name, named_weights
    from engine.loading.random_checkpoint import random_weights
    from engine.loading.tokenizer import TextTokenizer
    from engine.model import assemble_voicechat
    from engine.session import Session
    from engine.timeline import INPUT_FRAME_SAMPLES, INPUT_SAMPLE_RATE

    _, config, weights, quantized, raw_tokenizer, nbytes = random_weights(size, quantize=4, seed=0)
    voicechat = assemble_voicechat(
        config, weights, quantized, TextTokenizer(raw_tokenizer, "random"), name=size, nbytes=nbytes, numerics="fast"
    )
    mx.eval(voicechat.model.parameters())
    named = named_weights(voicechat.model)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "weights.json").write_text(json.dumps({_dot_name(i): name for i, name in enumerate(named)}))
    original = counters.GraphCensus.count

    def count(self: GraphCensus, stage: str, arrays: list[mx.array]) -> None:
        if self._frame.frame_index != frame:
            original(self, stage, arrays)
            return
        arrays = list(arrays)
        before = set(self._seen)
        original(self, stage, arrays)
        # The nodes this stage added to the census (those of an earlier stage not yet evaluated are not its own).
        buffer = io.StringIO()
        mx.export_to_dot(buffer, *self._weight_arrays, *[a for a in arrays if isinstance(a, mx.array)])
        stem = f"{len(list(out_dir.glob('frame*.dot'))):02d}-{stage}"
        (out_dir / f"frame{stem}.dot").write_text(buffer.getvalue())
        (out_dir / f"frame{stem}.nodes").write_text("\n".join(sorted(self._seen - before)))

    counters.GraphCensus.count = count  # type: ignore[method-assign]
    session = Session(voicechat, seed=0, census=GraphCensus(named))
    samples = bench_input(frame + 1)
    for start in range(0, samples.shape[0], INPUT_FRAME_SAMPLES):
        session.push(samples[start : start + INPUT_FRAME_SAMPLES], INPUT_SAMPLE_RATE)
    census = session.profiler.last_census
    session.close()
    print(f"frame {frame}: " + ", ".join(f"{s} {c.primitives}" for s, c in census.stages.items()))
    print("written:", sorted(path.name for path in out_dir.iterdir()))


def read(out_dir: Path) -> None:
    weights: dict[str, str] = json.loads((out_dir / "weights.json").read_text())
    for path in sorted(out_dir.glob("frame*.dot")):
        own = set(path.with_suffix(".nodes").read_text().split())
        rows = _stage_rows(path.read_text(), own, weights)
        print(f"=== {path.stem.split('-', 1)[1]}: {sum(rows.values())} primitives")
        for (kind, before, after), n in sorted(rows.items(), key=lambda item: (-item[1], item[0])):
            print(f"  {n:4d}  {kind:28s} {before:60s} {after}")


def _stage_rows(dot: str, own: set[str], weights: dict[str, str]) -> Counter[tuple[str, str, str]]:
    """The stage's own primitives: each kernel of Parley's by the weight it reads, every other primitive by the
    nearest weight-reading primitives before and after it."""
    kinds = {node: "Compiled" if kind.startswith("Compiled") else kind for node, kind in _PRIMITIVE.findall(dot)}
    inputs: dict[str, list[str]] = defaultdict(list)
    consumers: dict[str, list[str]] = defaultdict(list)
    producers: dict[str, list[str]] = defaultdict(list)
    outputs: dict[str, list[str]] = defaultdict(list)
    for array, node in _INPUT_EDGE.findall(dot):
        inputs[node].append(array)
        consumers[array].append(node)
    for node, array in _OUTPUT_EDGE.findall(dot):
        outputs[node].append(array)
        producers[array].append(node)

    def weight_of(node: str) -> str | None:
        names = [weights[a] for a in inputs[node] if a in weights]
        return _short(names[0]) if names else None

    def nearest(node: str, forward: bool) -> str:
        queue, visited = deque([(node, 0)]), {node}
        while queue:
            current, depth = queue.popleft()
            if depth > 0 and (kinds.get(current) == "CustomKernel" or weight_of(current)):
                return f"{kinds[current]}[{weight_of(current) or '-'}]"
            if depth >= 6:
                continue
            for array in outputs[current] if forward else inputs[current]:
                for other in consumers[array] if forward else producers[array]:
                    if other not in visited:
                        visited.add(other)
                        queue.append((other, depth + 1))
        return "?"

    rows: Counter[tuple[str, str, str]] = Counter()
    for node, kind in kinds.items():
        if node not in own:
            continue
        if kind == "CustomKernel":
            rows[("CustomKernel", weight_of(node) or "-", "")] += 1
        else:
            rows[(kind, f"after {nearest(node, False)}", f"before {nearest(node, True)}")] += 1
    return rows


def _short(name: str) -> str:
    name = re.sub(r"\.(\d+)\.", ".N.", name)
    for prefix in ("stt_model.", "tts_model.tts_model.", "tts_model."):
        name = name.removeprefix(prefix)
    return name


if __name__ == "__main__":
    if sys.argv[1] == "--read":
        read(Path(sys.argv[2]))
    else:
        size = sys.argv[2] if len(sys.argv) > 2 else "structure"
        dump(Path(sys.argv[1]), size, int(sys.argv[3]) if len(sys.argv) > 3 else 85)
