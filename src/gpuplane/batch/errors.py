"""The batch tier's exception: what it raises on purpose is a `BatchError` (the packing
planner's refusals are `ResourceError`s, a slice that can never fit, as in the control plane).

Raised where a pipeline, a run or the stage cache is misconfigured or cannot proceed, with what
to do in the message. Errors that enter from elsewhere are translated once, where they enter:
Ray's when the Ray runner starts, an import error of a pipeline module in `load_pipeline`. A
clip's own failure (its fetch, a stage, its reduction) fails that clip, not the run: it goes to
the run's `errors.jsonl` as raised. The CLI prints any `GpuplaneError` and exits with status 2.
"""

from gpuplane.errors import GpuplaneError


class BatchError(GpuplaneError):
    """A pipeline, a run or the stage cache is misconfigured or cannot proceed."""
