"""The bundle: a model that passed every gate, shaped for the device it will run on. `model.onnx`, the tokenizer
files, `config.json` with `id2label`, `predict.py` and `edgepress_device/` (the torch-free device package itself,
copied in: onnxruntime, tokenizers and numpy are all it needs) and `edgepress.json`, the manifest: target, the
onnxruntime it needs, opsets, every operator with its domain, inputs, max length, labels, what was measured on the
build machine and where, and a sha256 per file. A run's last step and `edgepress bundle` both call `bundle_model`."""

import contextlib
import io
import logging
import shutil
import tempfile
from pathlib import Path

from edgepress import device
from edgepress.deploy.card import CARD, write_card
from edgepress.deploy.targets import check_artifact, detect_target, resolve_target
from edgepress.deploy.web import CASCADE_JS, INDEX, web_files
from edgepress.device.bundle import BUNDLE_FILES, MANIFEST, check_readable, json_object, model_file
from edgepress.device.cascade import CASCADE, is_cascade, read_cascade
from edgepress.device.locks import check_not_written, writing
from edgepress.device.sessions import disabled_optimizers
from edgepress.errors import ConfigError, ModelError
from edgepress.files import atomic_dir, check_apart, check_owned, check_writable, file_sha256, read_onnx, write_json
from edgepress.models.sentence import module_folders
from edgepress.tasks import task_of
from edgepress.version import __version__

PREDICT = "predict.py"
DEVICE = "edgepress_device"  # the device package (`edgepress.device`), as a bundle carries it beside predict.py
# A bundle's predict.py: the command line, and `from predict import open_predictor` (a cascade's `Cascade`, else a
# `Predictor`) with the bundle dir on sys.path
PREDICT_PY = '''"""An edgepress bundle's own entry: `python predict.py --help`, or `from predict import open_predictor`
(a cascade's `Cascade`, else a `Predictor`) with this dir on sys.path. The code is the edgepress_device package
beside it (onnxruntime, tokenizers and numpy alone)."""

import sys
from pathlib import Path

sys.dont_write_bytecode = True  # the bundle stays the files its manifest lists: no __pycache__ beside them
from edgepress_device.cascade import Cascade, open_predictor  # noqa: E402
from edgepress_device.cli import main  # noqa: E402
from edgepress_device.predictor import Predictor  # noqa: E402

__all__ = ["Cascade", "Predictor", "main", "open_predictor"]

if __name__ == "__main__":
    sys.exit(main(here=Path(__file__).resolve().parent))
'''
ORT_MODEL, ORT_OPERATORS, USABILITY = "model.ort", "model.required_operators.config", "mobile_usability.txt"
EXPORTED = "edgepress-export.json"  # what `edgepress export` wrote (its record and files): not a bundle's file
GENERATED = (MANIFEST, PREDICT, ORT_MODEL, ORT_OPERATORS, USABILITY, INDEX, CASCADE_JS, EXPORTED, CARD)
# manifest fields a bundle derives itself: not carried over when a bundle is bundled again
_DERIVED = ("edgepress", "target", "ir_version", "opsets", "operators", "inputs", "onnxruntime", "files", "mobile",
            "web", "model_file")
# The first onnxruntime release implementing each ai.onnx opset and reading each IR version (onnxruntime's
# compatibility table, onnxruntime.ai/docs/reference/compatibility.html); contrib operators by the release that
# added their CPU kernel. A graph using anything not listed here needs the release it was built with.
ORT_FOR_OPSET = {14: "1.10", 15: "1.10", 16: "1.11", 17: "1.13", 18: "1.14", 19: "1.15", 20: "1.17", 21: "1.18"}
ORT_FOR_IR = {7: "1.10", 8: "1.14", 9: "1.15", 10: "1.18"}
ORT_FOR_CONTRIB = {op: "1.10" for op in ("Attention", "EmbedLayerNormalization", "SkipLayerNormalization",
                                          "BiasGelu", "FastGelu", "Gelu", "QAttention", "DynamicQuantizeMatMul",
                                          "MatMulIntegerToFloat", "QEmbedLayerNormalization")}
ORT_FOR_CONTRIB["MatMulNBits"] = "1.17"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def graph_facts(path: Path) -> dict:
    """ir_version, opsets {domain: version}, operators [{domain, op_type}] sorted, inputs [{name, dtype}]."""
    import onnx

    model = read_onnx(path, external_data=False)
    graph = model.graph
    operators = sorted({(n.domain or "ai.onnx", n.op_type) for n in graph.node})
    initializers = {t.name for t in graph.initializer}
    return {
        "ir_version": model.ir_version,
        "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "operators": [{"domain": d, "op_type": t} for d, t in operators],
        "inputs": [{"name": i.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name}
                   for i in graph.input if i.name not in initializers],
    }


def minimum_onnxruntime(facts: dict, built_with: str) -> str:
    """The oldest onnxruntime the graph's opset, IR version and operators are known to need; `built_with` (the
    release it was built and checked with) for anything the tables do not know."""
    needs = [ORT_FOR_OPSET.get(facts["opsets"].get("ai.onnx", 0), built_with),
             ORT_FOR_IR.get(facts["ir_version"], built_with)]
    needs += [ORT_FOR_CONTRIB.get(o["op_type"], built_with) for o in facts["operators"]
              if o["domain"] == "com.microsoft"]
    return max(needs, key=_version)


def operator_origins(run_root: Path | None) -> dict[str, str]:
    """{op_type: the first stage of the run whose graph has it}: whom to blame for an operator a target lacks."""

    origins: dict[str, str] = {}
    stages = sorted((run_root / "stages").glob("*/model/model.onnx")) if run_root else []
    for path in stages:
        for node in read_onnx(path, external_data=False).graph.node:
            origins.setdefault(node.op_type, path.parent.parent.name.split("-", 1)[1])
    return origins


def _graph(model_dir: Path) -> Path:
    """The ONNX file of a model dir or bundle (a web bundle keeps it in onnx/, its manifest says where)."""
    manifest = model_dir / MANIFEST
    return model_dir / model_file(json_object(manifest) if manifest.is_file() else {})


def final_of_run(path: Path, verb: str = "bundle") -> Path | None:
    """A run dir's `final/` bundle (None when `path` is not a run dir); a run that wrote none is a ModelError."""
    if not (Path(path) / "run.json").is_file():
        return None
    check_not_written(Path(path))
    final = Path(path) / "final"
    if not _graph(final).is_file() and _stopped(Path(path)):
        raise ModelError(f"{path} is a run that stopped before it finished: its report says running, and no process "
                         f"is writing it (it was killed, or its machine went down). Fix: run it again with "
                         f"`edgepress run CONFIG --out {path} --resume`: it continues from the last stage that passed")
    if not _graph(final).is_file():
        raise ModelError(f"{path} is a run without a final/ bundle (a gate failed, or it stopped before an export "
                         f"stage). Fix: finish the run, or {verb} one stage's model: {path}/stages/NN-NAME/model")
    return final


def _stopped(run: Path) -> bool:
    """The run dir `run` (no process writing it) holds a report of a run that never ended."""
    try:
        return json_object(run / "report.json").get("status") == "running"
    except ModelError:
        return False


def _source(path: Path) -> tuple[Path, Path | None]:
    """(the model dir to bundle, the run dir it came from or None): a run dir means its `final/` bundle."""
    path = Path(path)
    final = final_of_run(path)
    if final is not None:
        return final, path
    missing = [name for name in BUNDLE_FILES[1:] if not (path / name).is_file()]
    missing = ([] if _graph(path).is_file() else [BUNDLE_FILES[0]]) + missing
    if missing:
        raise ModelError(f"{path} cannot be bundled: missing {', '.join(missing)}. Fix: bundle a run dir, its "
                         f"final/, or an ONNX model dir (an export stage's model/, or `edgepress export` output) "
                         f"holding model.onnx, tokenizer.json and config.json")
    return path, None


def _check_out(out: Path, inputs: dict[str, Path], overwrite: bool) -> None:
    """`out` may take the bundle: apart from its inputs, and new, empty, or (with `overwrite`) an earlier bundle
    holding only its own files."""
    check_writable(out)
    check_apart(out, inputs)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out} exists and is not empty. Fix: choose a new dir, or pass --overwrite to "
                          f"replace it")
    check_owned(out, MANIFEST, "bundle")


def _same_logits(onnx_file: Path, ort_file: Path, output: str) -> float:
    """max |Δ| of the two files' `output` (logits, or sentence vectors: the task's) on 4 seeded random sequences of
    32 token ids; a ModelError when they disagree beyond float noise or on any argmax of logits."""
    import numpy as np

    from edgepress.device.sessions import load_session

    sessions = [load_session(onnx_file), load_session(ort_file)]
    ids = np.random.default_rng(0).integers(5, 100, (4, 32), dtype=np.int64)  # (batch, seq); any vocabulary has these
    columns = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feeds = {i.name: columns[i.name] for i in sessions[0].get_inputs()}
    first, second = (s.run([output], feeds)[0] for s in sessions)
    diff = float(np.abs(first - second).max())
    if diff > 1e-4 or (output == "logits" and (first.argmax(-1) != second.argmax(-1)).any()):  # per text or token
        raise ModelError(f"{ort_file} does not compute what {onnx_file} does (max |Δ{output}| {diff:.3g}). Fix: "
                         f"report it; bundle for another target meanwhile")
    return diff


def _ort_format(graph: Path, out: Path) -> None:
    """`graph` as `out`/ORT_MODEL, optimized at ORT's full level for ARM (`Fixed` style), and the operator config a
    size-reduced custom build takes. This is onnxruntime.tools.convert_onnx_models_to_ort's Fixed-style ARM path,
    which takes no optimizers to leave out: here the ones the graph's SESSION_FILE names stay out too, so a fusion
    the optimize stage measured slower (SkipLayerNormalization) is not put back into the ORT model."""
    import onnxruntime as ort
    from onnxruntime.tools.ort_format_model import create_config_from_models

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(out / ORT_MODEL)
    options.add_session_config_entry("session.save_model_format", "ORT")
    options.add_session_config_entry("session.qdqisint8allowed", "1")  # the converter's setting for ARM
    # NchwcTransformer: x86 only; the converter leaves it out for ARM as well
    ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"],
                         disabled_optimizers=["NchwcTransformer", *disabled_optimizers(graph)])
    create_config_from_models([out / ORT_MODEL], out / ORT_OPERATORS, enable_type_reduction=False)


def _mobile_files(tmp: Path, output: str) -> dict:
    """ONNX Runtime's mobile formats beside model.onnx: `model.ort` (optimized for ARM, `Fixed` style), checked to
    give model.onnx's `output`, the operator config a size-reduced custom build takes, and the mobile usability
    checker's report (NNAPI / CoreML)."""
    from onnxruntime.tools.mobile_helpers.usability_checker import analyze_model

    with tempfile.TemporaryDirectory(prefix="edgepress-ort-") as scratch:
        _ort_format(tmp / "model.onnx", Path(scratch))
        for name in (ORT_MODEL, ORT_OPERATORS):
            shutil.move(Path(scratch) / name, tmp / name)
    report, logger = io.StringIO(), logging.getLogger("edgepress.deploy.usability")
    handler = logging.StreamHandler(report)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the report is the file, not the run's log
    try:
        accelerated = analyze_model(tmp / "model.onnx", logger=logger)
    finally:
        logger.removeHandler(handler)
    (tmp / USABILITY).write_text(report.getvalue(), encoding="utf-8")
    return {"ort_model": ORT_MODEL, "required_operators": ORT_OPERATORS, "optimization_style": "Fixed",
            "target_platform": "arm",
            "ort_vs_onnx_max_abs_diff": _same_logits(tmp / "model.onnx", tmp / ORT_MODEL, output),
            "nnapi_or_coreml_recommended": bool(accelerated), "usability_report": USABILITY}


# where a cascade's bundle runs: on a CPU with predict.py (mobile: each graph's .ort beside it too), and in a web
# page (each graph in its transformers.js layout, the page deciding as predict.py: web.py's CASCADE_JS)
CASCADE_TARGETS = ("x86-vnni", "x86-avx2", "arm64", "mobile", "web")


def _copy_model(model_dir: Path, dest: Path, skip: tuple[str, ...] = ()) -> None:
    """A model dir's (or bundle's) own files into `dest`, not what a bundle makes itself (GENERATED) nor `skip`,
    and its graph as model.onnx (a web bundle's from where its manifest says)."""
    dest.mkdir(exist_ok=True)
    for f in sorted(model_dir.iterdir()):
        if f.is_file() and f.name not in (*GENERATED, *skip, BUNDLE_FILES[0]):
            shutil.copy2(f, dest / f.name)
    shutil.copy2(_graph(model_dir), dest / BUNDLE_FILES[0])


def write_bundle(model_dir: Path, out: Path, manifest: dict, cascade: bool = True) -> Path:
    """Copy an ONNX model dir (model.onnx + tokenizer + config.json) to `out` with `predict.py` and the manifest
    (`manifest` + graph facts + sha256 per file); a cascade's fallback (its `fallback/` and cascade.json) unless
    `cascade` is False; `out` appears whole or not at all."""
    import onnxruntime

    model_dir = Path(model_dir)
    config = json_object(model_dir / "config.json")
    graph = _graph(model_dir)
    facts = graph_facts(graph)
    target = manifest.get("target", {}).get("name")
    task = task_of(model_dir)  # read from the files the device reads; a manifest naming another task lies
    if manifest.get("task", task.name) != task.name:
        raise ModelError(f"{model_dir}: its manifest says task {manifest['task']}, its files say {task.name}. Fix: "
                         f"bundle the model from the run or model dir it came from")
    pipeline = task.web_pipeline(model_dir) if target == "web" else None  # a pooling the web lacks: refused here
    folder = read_cascade(model_dir)["fallback"] if cascade and is_cascade(model_dir) else None
    with atomic_dir(Path(out)) as tmp:
        _copy_model(model_dir, tmp, skip=() if folder else (CASCADE,))
        if folder:
            _copy_model(model_dir / folder, tmp / folder)
            manifest = {**manifest, "cascade": json_object(model_dir / CASCADE)}
        for module in module_folders(model_dir):  # a sentence encoder's: how it pools, beside modules.json
            shutil.copytree(module, tmp / module.relative_to(model_dir))
        if config.get("id2label") is None and task.labelled:  # transformers 5 saves no default label names
            names = manifest.get("labels") or {str(i): f"LABEL_{i}" for i in range(config.get("num_labels", 2))}
            write_json(tmp / "config.json", {**config, "id2label": names, "label2id": {v: int(k) for k, v in
                                                                                     names.items()}})
        (tmp / PREDICT).write_text(PREDICT_PY, encoding="utf-8")
        (tmp / DEVICE).mkdir()
        for module in sorted(Path(device.__file__).parent.glob("*.py")):
            shutil.copyfile(module, tmp / DEVICE / module.name)
        if target == "mobile":
            mobile = _mobile_files(tmp, task.graph_output)
            if "cascade" in manifest:  # the fallback's own .ort beside its graph
                mobile["fallback"] = _mobile_files(tmp / manifest["cascade"]["fallback"], task.graph_output)
            manifest = {**manifest, "mobile": mobile}
        if target == "web":
            fallback = (folder, graph_facts(tmp / folder / "model.onnx")["operators"]) if folder else None
            web = web_files(tmp, facts["operators"], manifest.get("max_length"), pipeline, task.name, fallback)
            manifest = {**manifest, "web": web, "model_file": web["model_file"]}
            facts = graph_facts(tmp / web["model_file"])  # with what the web layout added
        manifest = {"task": task.name, **manifest}  # what the device reads it as (`device.bundle.bundle_task`)
        write_card(tmp, {"edgepress": __version__, **manifest}, task, facts["operators"])
        files = {f.relative_to(tmp).as_posix(): file_sha256(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
        write_json(tmp / MANIFEST, {
            "edgepress": __version__, **manifest, **facts,
            "onnxruntime": {"minimum": minimum_onnxruntime(facts, onnxruntime.__version__),
                            "built_with": onnxruntime.__version__},
            "files": files})
    return Path(out)


def bundle_model(source: Path, out: Path, target: str | None = None, overwrite: bool = False,
                 manifest: dict | None = None, run_root: Path | None = None, no_cascade: bool = False) -> Path:
    """The bundle of `source` (a run dir, its final/, or an ONNX model dir) for `target` (None: the build
    machine's) in `out`. A graph the target does not suit is refused before anything is written. `manifest` (a
    run's last step) gives what the run measured; otherwise it comes from the source's own edgepress.json. A
    cascade is bundled whole (`no_cascade`: its student alone, whose manifest then says the cascade's figures are
    not the student's). `run_root`: the run writing it (its final/, under the run's lock); otherwise `out` is
    locked while it is written (device/locks.py), once every check has passed."""
    locked = run_root is None
    model_dir, found_run = _source(Path(source))
    check_readable(model_dir)
    run_root, out = run_root or found_run, Path(out)
    check_not_written(out)
    _check_out(out, {"the model being bundled": model_dir, **({"the run being bundled": found_run} if found_run
                                                              else {})}, overwrite)
    earlier = json_object(model_dir / MANIFEST) if (model_dir / MANIFEST).is_file() else {}
    base = manifest if manifest is not None else {k: v for k, v in earlier.items() if k not in _DERIVED}
    resolved = resolve_target(target)
    measured_on = base.get("measured_on")
    graph = _graph(model_dir)
    cascade = is_cascade(model_dir) and not no_cascade
    if cascade and resolved["name"] not in CASCADE_TARGETS:
        raise ConfigError(f"{model_dir} is a cascade, and a cascade's bundle runs on a CPU or in a web page "
                          f"({', '.join(CASCADE_TARGETS)}); target {resolved['name']} is not built for it yet. "
                          f"Fix: --no-cascade to ship its student alone, or target {' or '.join(CASCADE_TARGETS)}")
    check_artifact(resolved["name"], graph, graph_facts(graph)["operators"], measured_on, operator_origins(run_root))
    if cascade:
        fallback = _graph(model_dir / read_cascade(model_dir)["fallback"])
        check_artifact(resolved["name"], fallback, graph_facts(fallback)["operators"], measured_on, {})
    elif is_cascade(model_dir):  # the student alone: what the run measured was the cascade
        base = {**{k: v for k, v in base.items() if k != "metrics"},
                "not_measured": "the student of a cascade, bundled alone (--no-cascade): the run measured the "
                                "cascade, not its student alone; the stage before the cascade measured this model"}
    with writing(out, "--out") if locked else contextlib.nullcontext():
        return write_bundle(model_dir, out, {**base, "target": resolved}, cascade=cascade)


def run_manifest(run_root: Path, cfg, data, metrics: dict, meta: dict, source: Path, task,
                 gates: list[dict] = ()) -> dict:
    """What a run's bundle says of the run: model, data, stages, its `task` (edgepress.tasks) and labels (a
    classifier's, a token classifier's tags), max length, what was measured (the task's primary metric, agreement
    with the baseline, per scored set too, and latency) on which machine (`environment`, `measured_on`: that
    machine's own target) and when, and the `gates` its stages passed ({stage, kind, rule, limit, value, passed})."""
    primary = task.primary  # an embedder's: neighbour_overlap, against the baseline
    summary = {k: metrics[k] for k in (primary, f"{primary}_ci95", "n_test", "size_bytes")}
    summary |= {k: metrics[k] for k in ("primary_metric", "cosine", "cosine_ci95", "agreement", "agreement_ci95")
                if k in metrics}
    pairs = metrics.get("sets", {}).get("pairs", {})  # data.pairs: the labelled check of an embedder
    summary |= {k: pairs[k] for k in ("spearman", "spearman_ci95", "n_pairs") if k in pairs}
    summary["sets"] = {name: {k: figures[k] for k in (primary, "agreement", "spearman") if k in figures}
                       for name, figures in metrics.get("sets", {}).items()}
    summary["latency_p50_ms"] = {p: m["p50_ms"] for p, m in metrics.get("latency", {}).items()}
    summary["latency"] = {p: {k: m[k] for k in ("p50_ms", "p99_ms", "mean_ms", "batch_size", "sequence_length",
                                                "natural") if k in m} for p, m in metrics.get("latency", {}).items()}
    labels = {"labels": {str(k): v for k, v in data.id2label.items()}} if task.labelled else {}
    return {"model": cfg.model, "data": data.source, "max_length": cfg.data.max_length, **labels,
            "task": task.name, "stages": [s.name for s in cfg.stages],
            "source_artifact": str(source), "metrics": summary, "environment": meta.get("environment"),
            "measured_on": detect_target(), "measured_at": meta.get("started"), "run_id": meta.get("run_id"),
            "run": str(run_root), "gates": list(gates)}

