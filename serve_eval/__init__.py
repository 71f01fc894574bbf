"""Speculative decoding, its evaluation, the vLLM serving check and benchmarks."""
