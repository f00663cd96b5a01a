"""Float64 sequential references of the conventional recurrences (the yardsticks of every kernel)."""

from replayssm_kernels.conventional.mamba2 import mamba2_conventional_f64

__all__ = ["mamba2_conventional_f64"]
