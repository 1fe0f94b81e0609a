"""gpuplane: a control plane for an organisation's GPUs."""

from gpuplane.errors import ConfigError, GpuplaneError
from gpuplane.resources import Labels, Resources, Selector, Slice

__all__ = [
    "ConfigError",
    "GpuplaneError",
    "Labels",
    "Resources",
    "Selector",
    "Slice",
    "__version__",
]
__version__ = "0.1.0"
