"""A bundle's model card (README.md): what makes the bundle a Hugging Face model repo a user uploads as it is. Its
YAML front matter is what the Hub and `huggingface_hub.ModelCard` read: library_name, pipeline_tag, tags, the model
it was compressed from, and `model-index` with what its run measured (the task's primary metric and agreement with
the model it came from, per scored set). Below it, in words: those figures with the machine and the date that
measured them, the latency, the gates the run passed, how to run the bundle, and what it was not measured on.

Written from the manifest alone (`write_bundle`), so every bundle has one: a run's bundle with its figures, a model
dir's bundle saying that nothing was measured."""

import json
from pathlib import Path

from edgepress.deploy.web import INT8_OPS

CARD = "README.md"

# the words of the figures a card reports, by metric name
FIGURE_WORDS = {"accuracy": "Accuracy", "f1": "Entity F1", "neighbour_overlap": "Neighbour overlap with the "
                "teacher's vectors (top 10)", "agreement": "Agreement with the teacher", "spearman": "Spearman "
                "correlation with the pairs' scores", "cosine": "Cosine with the teacher's vectors"}


def _yaml(value, indent: int = 0) -> list[str]:
    """`value` (dicts, lists, strings, numbers) as block YAML lines; every string quoted as JSON (valid YAML)."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines += [f"{pad}{key}:", *_yaml(item, indent + 2)]
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return lines
    lines = []
    for item in value:
        inner = _yaml(item, indent + 2) if isinstance(item, dict | list) and item else [f"{pad}  {_scalar(item)}"]
        lines.append(f"{pad}- {inner[0].strip()}")
        lines += inner[1:]
    return lines


def _scalar(value) -> str:
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(value, ensure_ascii=False)


def _source_name(manifest: dict) -> str | None:
    """The model the bundle came from, by its last path part (`demo:minilm-movie` as it is)."""
    model = manifest.get("model")
    return None if model is None else Path(str(model)).name or str(model)


def _results(manifest: dict, task) -> list[dict]:
    """model-index's results: the test split's figures and each scored set's, as measured by the run."""
    metrics = manifest.get("metrics") or {}
    data = str(manifest.get("data") or "the run's data")
    found = []
    for name, figures in {"test": metrics, **metrics.get("sets", {})}.items():
        values = [{"type": key, "value": round(float(figures[key]), 4), "name": f"{FIGURE_WORDS.get(key, key)} "
                   f"({'test split' if name == 'test' else name})"} for key in (task.primary, "agreement", "spearman")
                  if isinstance(figures.get(key), int | float)]
        if values:
            found.append({"task": {"type": task.pipeline_tag},
                          "dataset": {"name": data if name == "test" else f"{data}: {name}", "type": data,
                                      "split": "test" if name == "test" else name},
                          "metrics": values})
    return found


def card_metadata(manifest: dict, task, operators: list[dict]) -> dict:
    """The front matter: what the Hub indexes the bundle by, and (a run's bundle) what the run measured."""
    target = (manifest.get("target") or {}).get("name")
    types = {op["op_type"] for op in operators}
    precision = [*(["int8"] if types & set(INT8_OPS) else []), *(["int4"] if "MatMulNBits" in types else [])]
    tags = ["edgepress", "onnx", task.name, *([target] if target else []), *precision,
            *(["cascade"] if "cascade" in manifest else [])]
    meta = {"library_name": "transformers.js" if target == "web" else "onnx", "pipeline_tag": task.pipeline_tag,
            "tags": list(dict.fromkeys(tags))}
    source = _source_name(manifest)
    results = _results(manifest, task)
    if results:
        meta["model-index"] = [{"name": f"{source or 'model'}-edgepress", "results": results}]
    meta["edgepress"] = {k: manifest[k] for k in ("model", "data", "run_id", "measured_on", "stages", "max_length")
                         if manifest.get(k) is not None}
    return meta


def _latency_lines(metrics: dict, environment: dict) -> list[str]:
    lines = []
    for provider, figures in (metrics.get("latency") or {}).items():
        shape = f"batch {figures.get('batch_size', 1)} × {figures.get('sequence_length', '?')} tokens"
        natural = figures.get("natural") or {}
        lines.append(f"- {provider}: p50 {figures['p50_ms']:.2f} ms, p99 {figures.get('p99_ms', float('nan')):.2f} "
                     f"ms at {shape}" + (f"; each text alone at its own length: mean {natural['mean_ms']:.2f} ms, "
                                          f"p99 {natural['p99_ms']:.2f} ms" if "mean_ms" in natural else ""))
    if not lines and metrics.get("latency_p50_ms"):
        lines = [f"- {p}: p50 {ms:.2f} ms" for p, ms in metrics["latency_p50_ms"].items()]
    where = ", ".join(str(environment[k]) for k in ("cpu", "machine") if environment.get(k))
    threads = environment.get("threads")
    on = f", {threads} thread{'s' if threads != 1 else ''}" if threads else ""
    return [*lines, f"\nTimed on {where or 'the machine the run ran on'}{on}, onnxruntime "
                    f"{environment.get('onnxruntime', '?')}."]


def _gate_lines(gates: list[dict]) -> list[str]:
    lines = []
    for gate in gates:
        value = gate.get("value")
        shown = f"{value:.4g}" if isinstance(value, int | float) else "—"
        lines.append(f"| {gate['stage']} | {gate['kind']} | {gate['rule']} | {gate['limit']:.4g} | {shown} | "
                     f"{'passed' if gate['passed'] else 'failed'} |")
    return ["| stage | gate | rule | limit | measured | verdict |", "|---|---|---|---|---|---|", *lines] if lines \
        else ["No gate was set."]


def _how_to_run(manifest: dict, task) -> list[str]:
    target = (manifest.get("target") or {}).get("name")
    example = json.dumps(task.example_text)
    lines = ["With the bundle's own entry (onnxruntime, tokenizers and numpy alone; no torch):", "", "```bash",
             "pip install onnxruntime tokenizers numpy", f"python predict.py {example}", "python predict.py --help",
             "```", ""]
    if "cascade" in manifest:
        return [*lines, "This bundle is a cascade: `predict.py` runs the student and hands the texts it is unsure of "
                        "to the fallback in `" + manifest["cascade"].get("fallback", "fallback") + "/`; the threshold "
                        "is in `cascade.json`."]
    model_file = manifest.get("model_file", "model.onnx")
    lines += ["From Python, with onnxruntime alone (in the bundle dir):", "", "```python",
              "import numpy as np", "import onnxruntime", "import tokenizers", "",
              f'session = onnxruntime.InferenceSession("{model_file}")',
              'tokenizer = tokenizers.Tokenizer.from_file("tokenizer.json")',
              f"encoding = tokenizer.encode({example})",
              'given = {"input_ids": encoding.ids, "attention_mask": encoding.attention_mask, '
              '"token_type_ids": encoding.type_ids}',
              "feeds = {i.name: np.array([given[i.name]], dtype=np.int64) for i in session.get_inputs()}",
              f'{task.graph_output} = session.run(["{task.graph_output}"], feeds)[0]', "```", ""]
    if target == "web":
        lines += [f"In a web page, with transformers.js: `index.html` loads this dir into a `{task.pipeline_tag}` "
                  f"pipeline (serve the dir, open the page).", ""]
    if task.optimum_class and target != "web":
        lines += [f"With optimum: `{task.optimum_class}.from_pretrained(bundle_dir)`, and the tokenizer beside it "
                  f"(`AutoTokenizer.from_pretrained(bundle_dir)`).", ""]
    return lines


def render_card(manifest: dict, task, operators: list[dict]) -> str:
    """README.md of a bundle whose manifest is `manifest` (its graph's `operators`)."""
    meta = card_metadata(manifest, task, operators)
    metrics, environment = manifest.get("metrics") or {}, manifest.get("environment") or {}
    source = _source_name(manifest) or "a model dir"
    target = (manifest.get("target") or {}).get("name", "the build machine")
    lines = ["---", *_yaml(meta), "---", "", f"# {source}, compressed by edgepress", "",
             f"A {task.name} model for target {target}, compressed from `{manifest.get('model', source)}` by "
             f"edgepress "
             f"{manifest.get('edgepress', '')} through the stages {', '.join(manifest.get('stages', [])) or '(none)'}.",
             ""]
    results = _results(manifest, task)
    if results:
        lines += ["## What the run measured", "", "| set | figure | value |", "|---|---|---|"]
        lines += [f"| {r['dataset']['split']} | {m['name']} | {m['value']:.4f} |" for r in results
                  for m in r["metrics"]]
        n_test = metrics.get("n_test")
        when = str(manifest.get("measured_at") or "")[:10]
        lines += ["", (f"On {n_test:,} test texts of `{manifest.get('data')}`" if n_test else "On the run's sets")
                  + (f", measured on {when}" if when else "") + (f" by run `{manifest['run_id']}`" if
                                                                 manifest.get("run_id") else "") + ".",
                  "", "## Latency", "",
                  *_latency_lines(metrics, environment), "", "## Gates passed", "",
                  *_gate_lines(manifest.get("gates", [])), ""]
    lines += ["## How to run it", "", *_how_to_run(manifest, task), "## What it was not measured on", ""]
    if not results:
        lines.append("Nothing: this bundle was made from a model dir, not a run, and edgepress measured nothing of it. "
                     "`edgepress run` measures a model and bundles what passed its gates.")
    else:
        measured_on = manifest.get("measured_on")
        lines.append(f"Only the sets above, on the run's machine (target {measured_on})."
                     + (f" Target {target} was not measured here: time it on the device (`python predict.py "
                        f"--bench`)." if measured_on and measured_on != target else "")
                     + " A text unlike the run's data may be scored differently.")
    if manifest.get("not_measured"):
        lines.append(f"\n{manifest['not_measured']}.")
    return "\n".join(lines).rstrip() + "\n"


def write_card(bundle: Path, manifest: dict, task, operators: list[dict]) -> None:
    """README.md into the bundle dir being written."""
    (Path(bundle) / CARD).write_text(render_card(manifest, task, operators), encoding="utf-8")
