"""The reference engine: Hugging Face checkpoints through hetero ops (see DESIGN.md section 8)."""
