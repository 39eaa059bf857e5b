"""To and from the tools everyone else uses: Hugging Face weights and tokenizer files, SavedModel, model card."""
