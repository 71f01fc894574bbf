"""The EAGLE-3 drafter (kind `eagle3`): a one-layer head on the verifier's low/middle/high hidden states."""
