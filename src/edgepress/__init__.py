"""edgepress: compress a trained BERT-family text classifier for devices, with gates between every stage.

The Python API (edgepress/api.py; every name is imported on first use, PEP 562, so `import edgepress` and
`edgepress --help` stay fast):

    import edgepress
    result = edgepress.run("pipeline.yaml", "runs/mine")      # a RunResult: stages, metrics, gates, the bundle
    predictor = edgepress.load(result.bundle)
    predictor.predict_each(["a quietly moving film"])

Also `validate`, `search`, `evaluate`, `export`, `bundle`, `init`, `demo` and `demo_teacher`; the config classes
(`PipelineConfig`, `StageConfig`, `DataConfig`, ... and each method's params class by its name, e.g.
`Int8DynamicConfig`); the results (`RunResult`, `SearchResult`, ...); the errors (`ConfigError`, `DataError`,
`GateFailed`, ...)."""

import logging
from importlib import import_module
from typing import Any

from edgepress.version import __version__

# a library call prints nothing: its records reach the handlers the caller configured (the CLI installs rich's), and
# without any, none (not Python's last-resort stderr handler)
logging.getLogger("edgepress").addHandler(logging.NullHandler())

_FROM = {
    "edgepress.api": ("run", "validate", "search", "evaluate", "export", "bundle", "init", "load", "demo",
                      "demo_teacher", "pipeline_config", "search_config", "Validated", "Exported"),
    "edgepress.results": ("RunResult", "SearchResult", "Stage", "Gate", "Metrics", "Latency", "Trial"),
    "edgepress.errors": ("EdgepressError", "ConfigError", "DataError", "ModelError", "GateFailed",
                         "ExportParityError", "ProviderUnavailable", "SystemRefused"),
    "edgepress.pipeline.config": ("PipelineConfig", "StageConfig", "RuntimeConfig", "Gates", "AccuracyGate",
                                  "LatencyGate", "SizeGate", "ParityGate", "FidelityGate", "OnFail", "Alternative"),
    "edgepress.search.config": ("SearchConfig",),
    "edgepress.data.config": ("DataConfig", "SplitConfig"),
    "edgepress.search.study": ("SearchExhausted",),
}
PACKAGES = ("search", "export")  # functions of the API that share a package's name
_WHERE = {name: module for module, names in _FROM.items() for name in names}
__all__ = ["__version__", *_WHERE]


def __getattr__(name: str) -> Any:
    if name in PACKAGES:  # the package itself, made callable (edgepress/callable_package.py)
        value = import_module(f"edgepress.{name}")
    elif name in _WHERE:
        value = getattr(import_module(_WHERE[name]), name)
    else:  # a method's params class, by its class name (Int8DynamicConfig, DistillConfig, ...)
        if not name.endswith("Config"):
            raise AttributeError(f"module 'edgepress' has no attribute {name!r}")
        from edgepress.registry import METHODS

        found = {m.config.__name__: m.config for m in METHODS.values()}
        if name not in found:
            raise AttributeError(f"module 'edgepress' has no attribute {name!r}")
        value = found[name]
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
