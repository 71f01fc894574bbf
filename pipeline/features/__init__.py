"""The verifier's hidden states as a dataset (`store`): written by data_prep/extract_features.py, read by
offline training so a training process never holds the verifier's decoder layers."""
