"""``sgl_kernel.speculative``: the NGRAM verify-metadata op SGLang imports from here on CPU."""

from sgl_kernel import reconstruct_indices_from_tree_mask  # noqa: F401  (re-exported for SGLang)
