"""A web bundle's files: the layout transformers.js loads from a local dir (onnx/model*.onnx by dtype), the page
(`index.html`) and the npm files it loads (transformers.js, onnxruntime-web's WebAssembly), and for a sentence
encoder the pooling options that compute its vector from the graph's token vectors."""

import json
import os
import shutil
from pathlib import Path

from edgepress.deploy.targets import CPU_INTEGER_OPS
from edgepress.device.bundle import MANIFEST, json_object
from edgepress.device.feeds import position_limit
from edgepress.errors import ConfigError, ModelError
from edgepress.files import read_onnx, write_json
from edgepress.models.sentence import TOKEN_OUTPUT

# the page, the module that answers with the bundle's model or its cascade (the page and web/*.mjs import it),
# and the folder of what the page loads
INDEX, CASCADE_JS, VENDOR = "index.html", "cascade.mjs", "vendor"
# What the page loads, from the npm packages `make web` installs (web/package-lock.json): transformers.js with
# onnxruntime-web inlined, and onnxruntime-web's WebAssembly binary (the page points `wasmPaths` at it)
WEB_ASSETS = {"transformers.min.js": "@huggingface/transformers/dist/transformers.min.js",
              "ort-wasm-simd-threaded.asyncify.wasm": "onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.wasm"}
INT8_OPS = (*CPU_INTEGER_OPS, "QuantizeLinear", "DequantizeLinear")  # an int8 graph, dynamic or QDQ


def web_modules() -> Path:
    """The node_modules holding transformers.js: $EDGEPRESS_WEB_MODULES, else web/node_modules of this checkout."""
    found = os.environ.get("EDGEPRESS_WEB_MODULES") or Path(__file__).resolve().parents[3] / "web" / "node_modules"
    found = Path(found)
    if not all((found / path).is_file() for path in WEB_ASSETS.values()):
        raise ConfigError(f"a web bundle needs transformers.js and onnxruntime-web's files, not found in {found}. "
                          f"Fix: `make web` in the edgepress checkout (npm ci --ignore-scripts in web/; Debian: "
                          f"apt-get install nodejs npm), or set EDGEPRESS_WEB_MODULES to a node_modules holding "
                          f"@huggingface/transformers 4.x")
    return found


def _token_output(path: Path) -> None:
    """The graph at `path` giving, beside its sentence vector, the token vectors its pooling reads (the tensor the
    export named TOKEN_OUTPUT) as a float32 output of that name: what transformers.js's feature-extraction pipeline
    pools. Inside the graph the tensor is renamed, and cast for the output (an fp16 graph's is float16)."""
    import onnx

    model = read_onnx(path, external_data=False)
    graph = model.graph
    if any(output.name == TOKEN_OUTPUT for output in graph.output):
        return  # a web bundle's graph, bundled again
    if not any(TOKEN_OUTPUT in node.output for node in graph.node):
        raise ModelError(f"{path} has no tensor named {TOKEN_OUTPUT} (the token vectors its pooling reads, which "
                         f"edgepress's export names: a graph exported by an older edgepress, or rewritten by another "
                         f"tool, lacks it), so a web bundle cannot give them to transformers.js. Fix: export the "
                         f"model again with this edgepress (a run's export stage, or `edgepress export`), then bundle "
                         f"that")
    inner = f"{TOKEN_OUTPUT}/pooled"
    for names in [*(node.input for node in graph.node), *(node.output for node in graph.node)]:
        names[:] = [inner if name == TOKEN_OUTPUT else name for name in names]
    for info in graph.value_info:
        info.name = inner if info.name == TOKEN_OUTPUT else info.name
    graph.node.append(onnx.helper.make_node("Cast", [inner], [TOKEN_OUTPUT], name=f"{TOKEN_OUTPUT}/float",
                                            to=onnx.TensorProto.FLOAT))
    graph.output.append(onnx.helper.make_tensor_value_info(TOKEN_OUTPUT, onnx.TensorProto.FLOAT,
                                                           ["batch_size", "sequence_length", None]))
    onnx.save(model, str(path))


def _web_dtype(operators: list[dict]) -> tuple[str, str]:
    """(transformers.js dtype, the file name it loads from onnx/) of the graph."""
    types = {o["op_type"] for o in operators}
    if "MatMulNBits" in types:
        return "q4", "model_q4.onnx"
    return ("q8", "model_quantized.onnx") if types & set(INT8_OPS) else ("fp32", "model.onnx")


def _model_layout(folder: Path, operators: list[dict], length: int, pipeline: dict) -> dict:
    """One model's files in `folder` as transformers.js loads them from a local dir: the graph in onnx/ under the
    name its dtype reads, config.json saying which dtype, tokenizer_config.json truncating at `length`."""
    dtype, name = _web_dtype(operators)
    (folder / "onnx").mkdir()
    (folder / "model.onnx").rename(folder / "onnx" / name)
    if pipeline["pipeline"] == "feature-extraction":
        _token_output(folder / "onnx" / name)
    config = json_object(folder / "config.json")
    write_json(folder / "config.json", {**config, "transformers.js_config": {"dtype": dtype}})
    tokenizer = json_object(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    write_json(folder / "tokenizer_config.json", {**tokenizer, "model_max_length": length})
    return {"dtype": dtype, "model_file": f"onnx/{name}"}


def web_files(tmp: Path, operators: list[dict], max_length: int | None, pipeline: dict, task: str,
              fallback: tuple[str, list[dict]] | None = None) -> dict:
    """The layout transformers.js loads from a local dir (`_model_layout`: transformers.js truncates at
    model_max_length only, so at the length the model was measured at), the page and what it loads. `pipeline`: the
    transformers.js pipeline the page runs and its options; for feature-extraction, the graph gives the token
    vectors too (`_token_output`). `fallback`: a cascade's fallback (its folder inside `tmp`, its graph's
    operators), laid out the same way in its folder (with an edgepress.json there saying where its graph is and
    its `task`, for predict.py), truncating where the student does; the page runs the cascade (CASCADE_JS)."""
    modules = web_modules()
    length = max_length or position_limit(json_object(tmp / "config.json"))
    layout = _model_layout(tmp, operators, length, pipeline)
    if fallback is not None:
        folder, fallback_operators = fallback
        inner = _model_layout(tmp / folder, fallback_operators, length, pipeline)
        write_json(tmp / folder / MANIFEST, {**inner, "max_length": length, "task": task})
        layout["fallback"] = inner
    for name in (INDEX, CASCADE_JS):
        shutil.copyfile(Path(__file__).with_name(name), tmp / name)
    (tmp / VENDOR).mkdir()
    for target, source in WEB_ASSETS.items():
        shutil.copyfile(modules / source, tmp / VENDOR / target)
    versions = {package: json.loads((modules / package / "package.json").read_text())["version"]
                for package in ("@huggingface/transformers", "onnxruntime-web")}
    return {**layout, "page": INDEX, "max_length": length, **pipeline, **versions}
