"""A seeded generator of broken models: structured and byte-level mutations of small ONNX models.

`mutate(model_bytes, rng)` returns (kind, mutated bytes). Structured kinds edit the ModelProto
(dims, dtypes, attributes, node inputs, op types, opsets, duplicate names, cycles, initializer
data); byte kinds flip, truncate or insert bytes of the serialized model. Every case is a
function of its seed, so a failure reproduces: `python -m tests.fuzz_models --cases 500` runs
the same cases as the CI test (tests/test_fuzz.py) and more, and prints the counts by outcome.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto, helper

__all__ = ["BASES", "KINDS", "Case", "base_folders", "check_model", "mutate", "run_case", "summary"]

# The models mutated: small zoo models (tests/zoo_small.py) that cover the common ops.
BASES = ("mlp", "transformer", "nnt-conv-ac-fl")
# Which file of the artifact folder a case mutates (the forward model goes through ONNX
# Runtime's artifact generation: slower, so fewer cases).
TARGETS = (("training_model.onnx", 0.8), ("optimizer_model.onnx", 0.1), ("forward.onnx", 0.1))
# `plan` options of a case: the defaults half the time, else one of these (every pass, order,
# planner and memory strategy gets its share of broken models).
PLAN_OPTIONS = (
    ["--order", "given", "--planner", "naive"], ["--order", "nntrainer", "--planner", "sort"],
    ["--order", "greedy", "--planner", "best-fit"], ["--planner", "greedy-size", "--no-inplace"],
    ["--no-interleave"], ["--budget", "1KiB", "--no-profile"], ["--budget", "1KiB", "--swap", "on-demand"],
    ["--swap", "proactive", "--lookahead", "2"], ["--checkpoint", "rotor", "--no-profile"],
    ["--checkpoint", "sqrt", "--no-profile"],
)

_HUGE = [0, -1, -7, 2**31, 2**40, 2**62, 2**63 - 1]
_DTYPES = [TensorProto.UNDEFINED, TensorProto.STRING, TensorProto.COMPLEX64, TensorProto.BOOL,
           TensorProto.INT8, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE, 40, 1000]
_OPS = [("Frobnicate", ""), ("Relu", "com.example"), ("Relu", ""), ("Add", ""), ("MatMul", ""),
        ("Softmax", ""), ("Identity", ""), ("Reshape", ""), ("Conv", ""), ("Gemm", ""),
        ("InPlaceAccumulatorV2", "com.microsoft"), ("SoftmaxCrossEntropyLossInternal", "com.microsoft"),
        ("Loop", ""), ("If", "")]


def _node(m, rng):
    return rng.choice(m.graph.node) if len(m.graph.node) else None


def _dims(m, rng):
    vis = [vi for vi in [*m.graph.input, *m.graph.output, *m.graph.value_info] if vi.type.HasField("tensor_type")]
    vi = rng.choice(vis)
    dims = vi.type.tensor_type.shape.dim
    if not len(dims) or rng.random() < 0.15:
        dims.add().dim_value = rng.choice(_HUGE)
        return
    d = rng.choice(dims)
    if rng.random() < 0.2:
        d.dim_param = rng.choice(["", "batch", "N", "\u00e9"])
    else:
        d.dim_value = rng.choice(_HUGE)


def _init_dims(m, rng):
    if not len(m.graph.initializer):
        return _dims(m, rng)
    t = rng.choice(m.graph.initializer)
    if len(t.dims) and rng.random() < 0.7:
        t.dims[rng.randrange(len(t.dims))] = rng.choice(_HUGE + [3])
    else:
        t.dims.append(rng.choice([1, 2, 0]))


def _dtype(m, rng):
    if rng.random() < 0.5 or not len(m.graph.initializer):
        vi = rng.choice([*m.graph.input, *m.graph.output])
        vi.type.tensor_type.elem_type = rng.choice(_DTYPES)
    else:
        rng.choice(m.graph.initializer).data_type = rng.choice(_DTYPES)


def _attribute(m, rng):
    nodes = [n for n in m.graph.node if len(n.attribute)]
    if not nodes:
        return _op_type(m, rng)
    n = rng.choice(nodes)
    i = rng.randrange(len(n.attribute))
    r = rng.random()
    if r < 0.35:
        del n.attribute[i]
    elif r < 0.6:  # the same name, another type
        name = n.attribute[i].name
        del n.attribute[i]
        n.attribute.append(rng.choice([helper.make_attribute(name, "garbage"), helper.make_attribute(name, 2.5),
                                       helper.make_attribute(name, [1, 2, 3]), helper.make_attribute(name, -3)]))
    elif r < 0.85:  # an out-of-range value of the same type
        a = n.attribute[i]
        if a.type == onnx.AttributeProto.INT:
            a.i = rng.choice([-1, -100, 2**40, 7])
        elif a.type == onnx.AttributeProto.INTS:
            del a.ints[:]
            a.ints.extend(rng.choice([[], [-1], [0, 0], [2**40, 1], [1] * 9]))
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0])
        else:
            a.name = "no_such_attribute"
    else:
        n.attribute.append(helper.make_attribute(rng.choice(["axis", "perm", "bogus", "transA"]),
                                                 rng.choice([5, -9, [9, 9], "x"])))


def _inputs(m, rng):
    n = _node(m, rng)
    if n is None:
        return
    r = rng.random()
    if r < 0.4 and len(n.input):
        n.input[rng.randrange(len(n.input))] = rng.choice(["dangling", "", "x" * 300])
    elif r < 0.6 and len(n.input):
        del n.input[rng.randrange(len(n.input))]
    elif r < 0.8:
        n.input.append(rng.choice(["", "dangling", n.output[0] if len(n.output) else "y"]))
    elif len(n.output):
        n.output[rng.randrange(len(n.output))] = rng.choice(["", "dangling_out"])


def _op_type(m, rng):
    n = _node(m, rng)
    if n is not None:
        n.op_type, n.domain = rng.choice(_OPS)


def _opset(m, rng):
    if not len(m.opset_import):
        m.opset_import.add(domain="", version=17)
    o = rng.choice(m.opset_import)
    r = rng.random()
    if r < 0.7:
        o.version = rng.choice([0, 1, 6, 9, 30, 1000, -1])
    elif r < 0.85:
        o.domain = rng.choice(["com.example", "ai.onnx.ml", ""])
    else:
        m.ir_version = rng.choice([0, 1, 3, 11, 99])


def _duplicate(m, rng):
    nodes = list(m.graph.node)
    r = rng.random()
    if r < 0.4 and len(nodes) >= 2:  # two producers of one value
        a, b = rng.sample(nodes, 2)
        if len(a.output) and len(b.output):
            b.output[0] = a.output[0]
    elif r < 0.6 and len(m.graph.initializer):
        m.graph.initializer.append(rng.choice(m.graph.initializer))
    elif r < 0.8 and len(nodes):
        n = rng.choice(nodes)
        m.graph.node.append(n)  # the same node twice
    elif len(nodes) >= 2:  # two nodes with one name, or an input also an initializer
        a, b = rng.sample(nodes, 2)
        b.name = a.name
    elif len(m.graph.input):
        m.graph.input.append(m.graph.input[0])


def _cycle(m, rng):
    nodes = list(m.graph.node)
    if len(nodes) < 2:
        return
    i, j = sorted(rng.sample(range(len(nodes)), 2))
    a, b = nodes[i], nodes[j]
    if len(a.input) and len(b.output):
        a.input[rng.randrange(len(a.input))] = b.output[0]  # an earlier node reads a later output
    if rng.random() < 0.5 and len(a.output) and len(b.input):
        b.input[0] = a.output[0]
    if rng.random() < 0.3:  # or reorder the nodes (not topological)
        reordered = nodes[:]
        rng.shuffle(reordered)
        del m.graph.node[:]
        m.graph.node.extend(reordered)


def _initializer_data(m, rng):
    inits = list(m.graph.initializer)
    if not inits:
        return _inputs(m, rng)
    t = rng.choice(inits)
    if t.raw_data:
        cut = rng.randrange(len(t.raw_data)) if rng.random() < 0.8 else len(t.raw_data) + 5
        t.raw_data = t.raw_data[:cut] if cut <= len(t.raw_data) else t.raw_data + b"\0" * 5
    elif len(t.float_data):
        del t.float_data[rng.randrange(len(t.float_data)):]
    elif len(t.int64_data):
        del t.int64_data[rng.randrange(len(t.int64_data)):]
    else:
        t.raw_data = b"\x01\x02\x03"


def _remove(m, rng):
    r = rng.random()
    if r < 0.5 and len(m.graph.node):
        del m.graph.node[rng.randrange(len(m.graph.node))]
    elif r < 0.7 and len(m.graph.output):
        del m.graph.output[rng.randrange(len(m.graph.output))]
    elif r < 0.85 and len(m.graph.input):
        del m.graph.input[rng.randrange(len(m.graph.input))]
    elif len(m.graph.initializer):
        del m.graph.initializer[rng.randrange(len(m.graph.initializer))]


_STRUCTURED = {
    "dims": _dims, "initializer-dims": _init_dims, "dtype": _dtype, "attribute": _attribute,
    "inputs": _inputs, "op-type": _op_type, "opset": _opset, "duplicate": _duplicate, "cycle": _cycle,
    "initializer-data": _initializer_data, "remove": _remove,
}


def _flip(data: bytes, rng) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 8])):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _truncate(data: bytes, rng) -> bytes:
    return data[: rng.randrange(len(data))]


def _insert(data: bytes, rng) -> bytes:
    i = rng.randrange(len(data) + 1)
    return data[:i] + bytes(rng.randrange(256) for _ in range(rng.choice([1, 2, 5, 40]))) + data[i:]


_BYTES = {"flip": _flip, "truncate": _truncate, "insert": _insert}
KINDS = (*_STRUCTURED, *_BYTES)


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One mutation of serialized model `data`: 3 in 4 structured (1 to 3 edits), 1 in 4 bytes."""
    if rng.random() < 0.25:
        kind = rng.choice(list(_BYTES))
        return kind, _BYTES[kind](data, rng)
    m = onnx.ModelProto()
    m.ParseFromString(data)
    kinds = [rng.choice(list(_STRUCTURED)) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    for kind in kinds:
        _STRUCTURED[kind](m, rng)
    return "+".join(kinds), m.SerializeToString()


@dataclass
class Case:
    seed: int
    base: str
    target: str
    kind: str
    codes: tuple[int, ...]  # exit codes of inspect, plan
    problem: str | None  # a traceback or an exit code outside {0, 2, 3}: what was seen
    options: tuple[str, ...] = ()  # of `plan`


def base_folders() -> dict[str, Path]:
    from tests.zoo_small import small_artifacts

    return {name: small_artifacts(name) for name in BASES}


def run_case(seed: int, bases: dict[str, Path], work: Path) -> Case:
    """Mutate one file of a copied artifact folder (seeded), run `inspect` and `plan` on it
    in-process; a problem is an exit code outside {0, 2, 3} or a traceback anywhere."""
    rng = random.Random(seed)
    base = rng.choice(sorted(bases))
    target = rng.choices([t for t, _ in TARGETS], [w for _, w in TARGETS])[0]
    folder = work / f"case{seed}"
    shutil.copytree(bases[base], folder)
    kind, data = mutate((folder / target).read_bytes(), rng)
    options = rng.choice(PLAN_OPTIONS) if rng.random() < 0.5 else []
    (folder / target).write_bytes(data)
    model = str(folder / target) if target == "forward.onnx" else str(folder)
    codes, problem = check_model(model, options)
    shutil.rmtree(folder, ignore_errors=True)
    return Case(seed, base, target, kind, codes, problem, tuple(options))


def check_model(model: str, plan_options: list[str]) -> tuple[tuple[int, ...], str | None]:
    """Exit codes of `inspect MODEL` and `plan MODEL ...` (in-process), and the problem seen:
    an exception that escaped the CLI, an exit code outside {0, 2, 3} (4 is a bug), a traceback."""
    from typer.testing import CliRunner

    from onnxplan.cli.app import app

    runner = CliRunner()
    codes: list[int] = []
    for args in (["inspect", model], ["plan", model, "--time-limit", "1", *plan_options]):
        r = runner.invoke(app, args)
        codes.append(r.exit_code)
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            return tuple(codes), f"{args[0]}: uncaught {type(r.exception).__name__}: {r.exception}"
        if r.exit_code not in (0, 2, 3) or "Traceback" in r.stdout + r.stderr:
            return tuple(codes), f"{args[0]}: exit {r.exit_code}: {r.stderr.strip()[-400:]}"
    return tuple(codes), None


def summary(cases: list[Case]) -> str:
    outcome = Counter("problem" if c.problem else "/".join(map(str, c.codes)) for c in cases)
    lines = [f"{len(cases)} cases; exit codes inspect/plan: "
             + ", ".join(f"{k}: {v}" for k, v in sorted(outcome.items()))]
    lines.append("by target: " + ", ".join(f"{k}: {v}" for k, v in sorted(Counter(c.target for c in cases).items())))
    return "\n".join(lines)


def main() -> None:
    import argparse
    import os
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--first", type=int, default=0, help="seed of the first case")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("ONNXPLAN_CACHE", str(Path(tmp) / "cache"))
        bases = base_folders()
        cases = []
        for seed in range(args.first, args.first + args.cases):
            c = run_case(seed, bases, Path(tmp))
            cases.append(c)
            if c.problem:
                print(f"seed {c.seed} {c.base} {c.target} {c.kind} {' '.join(c.options)}: {c.problem}", flush=True)
        print(summary(cases))


if __name__ == "__main__":
    main()
