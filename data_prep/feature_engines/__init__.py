"""Engines of stage extract_features: the verifier's hidden states of token rows (`vllm_engine`: vLLM)."""
