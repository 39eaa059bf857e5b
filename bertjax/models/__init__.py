"""The encoder, its pretraining heads and the task heads; the size table and platform defaults."""
