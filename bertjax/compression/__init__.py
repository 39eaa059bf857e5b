"""Making a trained encoder smaller and faster: quantisation, pruning, distillation, and their report."""
