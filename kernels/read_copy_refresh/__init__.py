"""Split precision: the read copy's refresh from the checkpoint, outside the decode kernels.

Fused Triton kernel in ``kernel.py`` (``refresh_read_copy``), plain-torch reference in
``reference.py`` (``refresh_read_copy_ref``, ``quantize_rows`` of a gather, then a scatter). The
rounding rule itself (``quantize_rows`` / ``fp8_row_scale``) stays in
``mamba2_decode/read_copy.py``, shared with the decode and verify kernels' flush rows.
"""

from replayssm_kernels.read_copy_refresh.kernel import refresh_read_copy
from replayssm_kernels.read_copy_refresh.reference import refresh_read_copy_ref

__all__ = ["refresh_read_copy", "refresh_read_copy_ref"]
