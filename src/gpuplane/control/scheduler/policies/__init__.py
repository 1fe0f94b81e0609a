"""The built-in scheduling policies, one module each; importing this package registers them."""

from gpuplane.control.scheduler.policies import (  # noqa: F401
    best_fit,
    binpack,
    fgd,
    frag,
    packing,
    random_fit,
    spread,
)
