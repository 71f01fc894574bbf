"""The DFlash-style block-diffusion drafter (kind `block`)."""
