"""The device side: what a bundle runs with onnxruntime, tokenizers, numpy and the standard library alone. Each
module imports those and its siblings (relatively) and nothing else, so `edgepress bundle` copies this folder into
every bundle as it is, beside a small `predict.py` that calls `cli.main`: the code a device runs is the code edgepress
tests (`tests/test_bundle.py` runs it in a venv holding those three packages alone).

- `errors`: the error tree a device can meet (edgepress's own errors are these classes and more).
- `bundle`: what a bundle dir holds, and the one JSON reader.
- `sessions`: ONNX Runtime sessions on checked providers, and the graph's inputs and outputs.
- `feeds`: tokenization and the model feeds (a call's texts, a fixed timing shape, natural lengths).
- `timing`: the one timing loop, and what the CPU is.
- `entities`: a token classifier's entities in raw text, as transformers' pipeline finds them.
- `predictor`: `Predictor`, a bundle's labels, vectors, tags and entities.
- `cli`: `python predict.py`.
"""
