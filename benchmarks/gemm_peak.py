"""What this CPU gives int8 over fp32: one ONNX Runtime MatMul (fp32) and MatMulInteger (u8 x s8, what dynamic int8
runs), BERT-base FFN shape, interleaved. Whether `int8-dynamic` pays off in latency depends on this ratio: on an
AMX or VNNI Xeon it was 10x or more; on some AVX2 CPUs int8 is no faster than fp32 and only the size shrinks.

    .venv/bin/python benchmarks/gemm_peak.py [--threads 2] [--out FILE]

Writes benchmarks/results/gemm_peak.json.
"""

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgepress.device.timing import cpu_model, isa_flags

M, K, N = 512, 768, 3072  # 4 sentences x 128 tokens through BERT-base's first FFN matrix


def session(int8: bool, threads: int):
    rng = np.random.default_rng(0)
    if int8:
        weight = rng.integers(-128, 128, (K, N), dtype=np.int8)
        kinds, op = (TensorProto.UINT8, TensorProto.INT32), "MatMulInteger"
    else:
        weight = rng.random((K, N), dtype=np.float32)
        kinds, op = (TensorProto.FLOAT, TensorProto.FLOAT), "MatMul"
    graph = helper.make_graph([helper.make_node(op, ["a", "w"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("a", kinds[0], [M, K])],
                              [helper.make_tensor_value_info("y", kinds[1], [M, N])],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # what onnxruntime 1.31 reads (onnx 1.23 writes 14 by default)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    feed = rng.integers(0, 256, (M, K), dtype=np.uint8) if int8 else rng.random((M, K), dtype=np.float32)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]), feed


def giga_ops_per_second(sess, feed, runs: int = 30) -> float:
    for _ in range(5):
        sess.run(None, {"a": feed})
    start = time.perf_counter()
    for _ in range(runs):
        sess.run(None, {"a": feed})
    return 2 * M * K * N * runs / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/gemm_peak.json")
    args = parser.parse_args()
    sessions = {"fp32": session(False, args.threads), "int8_u8s8": session(True, args.threads)}
    rates = {name: [] for name in sessions}
    for _ in range(args.rounds):
        for name, (sess, feed) in sessions.items():
            rates[name].append(giga_ops_per_second(sess, feed))
            time.sleep(0.2)  # let ORT's worker threads go idle before the next candidate
    result = {"machine": platform.node(), "cpu": cpu_model(),
              "isa": isa_flags(),
              "threads": args.threads, "shape": [M, K, N], "onnxruntime": ort.__version__,
              "gops": {name: round(float(np.median(r)), 1) for name, r in rates.items()}}
    result["int8_over_fp32"] = round(result["gops"]["int8_u8s8"] / result["gops"]["fp32"], 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
