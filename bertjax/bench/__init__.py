"""What measures or predicts speed and memory: the benchmarks and their peers (Hugging Face,
sentence-transformers), step profiles, timing, the input benchmark, the model summary and the planner."""
