"""Attention beyond softmax: Gated DeltaNet's kernels (linear attention) and DeepSeek's sparse attention.

- :mod:`.measure_linear` (``python -m validation.studies.attention.measure_linear``): times
  flash-linear-attention's Gated DeltaNet kernels on a local GPU, as rows of the kernels CSV schema;
- :mod:`.fit_linear` (``python -m validation.studies.attention.fit_linear``): fits the two kernel constants
  of :mod:`simcore.models.linear_attention` on those rows;
- :mod:`.sparse_layouts` (``python -m validation.studies.attention.sparse_layouts``): DeepSeek-V3.2's sparse
  attention against V3's dense MLA under attention TP and attention DP at one long prompt length.
"""
