"""Prompt sources, the demo verifier and the corpus of verifier responses."""
