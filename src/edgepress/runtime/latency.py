"""The latency harness's settings. The harness itself (warm-up, N timed runs, p50/p90/p99/mean, one loop for ONNX
Runtime and torch runners so ratios are like for like; fixed batch x sequence shapes of real tokens and the real test
sentences one at a time at their natural lengths) is in the torch-free predictor, so a bundle times itself with the
same code (`python predict.py --bench`)."""

from pydantic import BaseModel, ConfigDict, Field


class LatencyConfig(BaseModel):
    """The `runtime.latency` section: the fixed shape, warm-up and timed runs."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    batch_size: int = Field(1, ge=1, le=4096, description="texts per timed call")
    sequence_length: int = Field(128, ge=2, le=8192, description="tokens per text of the fixed shape (real tokens, "
                                                                "not padding)")
    warmup: int = Field(20, ge=0, le=100_000, description="untimed calls first")
    runs: int = Field(200, ge=1, le=1_000_000, description="timed calls; p50/p90/p99 are over these")
