"""Training app: accelerate-launched pretraining and SFT (see README.md)."""
