"""Linear attention (Katharopoulos et al., 2020, "Transformers are RNNs"), as Dinomaly's decoder uses it (Guo et
al., CVPR 2025, "Dinomaly: The Less Is More Philosophy in Multi-Class Unsupervised Anomaly Detection", sec. 3.3):

    phi(x) = elu(x) + 1;   out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j))

per head, O(N d^2) instead of softmax's O(N^2 d). With no softmax to sharpen it, a query cannot focus on the one
key that is itself, so a reconstructing decoder cannot copy its input ("leaky" identity mapping is what Dinomaly
avoids). The layer keeps `Attention`'s parameters (`qkv`, `proj`) and contract, so `Block(attn_layer=...)` takes it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import Attention

__all__ = ["LinearAttention"]


class LinearAttention(Attention):
    """Attention's projections with the kernelised, normalised linear form above; no masks, no maps."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, is_causal: bool = False,
                return_attention: bool = False, num_queries: int | None = None,
                rope: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        if mask is not None or is_causal or return_attention or num_queries is not None or rope is not None:
            raise ValueError("linear attention takes no mask, causal order, maps, query subset or rotary table; "
                             "use Attention for those.")
        q, k, v = self._qkv(x)  # (B, H, N, d) each
        q, k = F.elu(q) + 1.0, F.elu(k) + 1.0  # phi: positive features
        kv = torch.einsum("bhnd,bhne->bhde", k, v)  # (B, H, d, d): sum_j phi(k_j) v_j^T
        z = 1.0 / torch.einsum("bhnd,bhd->bhn", q, k.sum(dim=2))  # (B, H, N): 1 / phi(q_i)^T sum_j phi(k_j)
        out = torch.einsum("bhnd,bhde,bhn->bhne", q, kv, z)  # (B, H, N, d)
        return self._project(out), None
