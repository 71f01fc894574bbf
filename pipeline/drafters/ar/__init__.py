"""The autoregressive drafter (kind `ar`)."""
