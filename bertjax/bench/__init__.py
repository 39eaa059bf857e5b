"""Benchmarks and their peers (Hugging Face, sentence-transformers), step profiles and timing."""
