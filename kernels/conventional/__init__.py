"""Float64 sequential references of the conventional recurrences (the yardsticks of every kernel)."""

from replayssm_kernels.conventional.gdn import gdn_conventional_f64
from replayssm_kernels.conventional.mamba2 import mamba2_conventional_f64

__all__ = ["gdn_conventional_f64", "mamba2_conventional_f64"]
