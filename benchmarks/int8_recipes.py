"""Which int8-dynamic params keep an encoder's outputs, judged on the validation texts (choosing a recipe is
selecting: never on the test split). Each recipe quantizes the fused graph in `--graph` once into `--work`/NAME, and
its outputs on the demo's 1,057 validation texts, one text a call as a device makes them, are compared with the
fused float graph's: neighbour overlap and cosine for a sentence encoder (the nodes `keep_float: N` left float are
recorded). A recipe that fails int8's own parity check is recorded as failed, with the check's words.

    .venv/bin/edgepress run examples/embedding-base.yaml --out runs/embedding-base   # export and fuse (all-mpnet)
    .venv/bin/python benchmarks/int8_recipes.py --graph runs/embedding-base/stages/02-fuse/model \
        --out benchmarks/results/int8_recipes_mpnet.json 'plain={}' 'a85={"smooth": 0.85}' \
        'a85-gptq={"smooth": 0.85, "gptq": true}' 'a80-gptq-keep6={"smooth": 0.8, "gptq": true, "keep_float": 6}' ...
    # every recipe is Int8DynamicConfig(per_channel=True, **params); what docs/results.md's all-mpnet table quotes
"""

import argparse
import json
from pathlib import Path


def main() -> None:
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
    from edgepress.data import DataConfig, load_data
    from edgepress.data.metrics import embedding_metrics
    from edgepress.errors import ExportParityError
    from edgepress.files import read_json, write_json
    from edgepress.pipeline.measure import onnx_predictions
    from edgepress.tasks import EMBEDDING

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", type=Path, required=True, help="the fused float ONNX dir of a sentence encoder")
    parser.add_argument("--work", type=Path, default=Path("runs/int8-recipes"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("recipes", nargs="+", help="NAME=JSON params of int8-dynamic (per_channel is set)")
    args = parser.parse_args()
    texts = load_data(DataConfig()).validation.texts
    reference = onnx_predictions(args.graph, texts, 128, 2, task=EMBEDDING)
    result = read_json(args.out) if args.out.is_file() else {}
    for name, params in (r.split("=", 1) for r in args.recipes):
        params = json.loads(params)
        try:
            details = int8_dynamic(args.graph, args.work / name, texts, Int8DynamicConfig(per_channel=True, **params))
        except ExportParityError as e:
            result[name] = {"params": params, "failed": str(e)}
        else:
            vectors = onnx_predictions(args.work / name, texts, 128, 2, task=EMBEDDING)
            metrics = embedding_metrics(reference, vectors)
            result[name] = {"params": params, "kept_float": details["kept_float"],
                            "neighbour_overlap": metrics["neighbour_overlap"], "cosine": metrics["cosine"]}
        print(name, json.dumps(result[name]), flush=True)
        write_json(args.out, result)


if __name__ == "__main__":
    main()
