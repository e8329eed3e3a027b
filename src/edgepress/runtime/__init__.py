"""The edgepress side of running graphs: sessions opened from edgepress's validated configs (kernels counted) and
the latency harness's settings. What a device runs is `edgepress.device`. Nothing here imports torch or transformers."""
