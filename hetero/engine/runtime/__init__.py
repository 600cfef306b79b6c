"""The serving loop: sequences, the block manager, the scheduler and the model runner."""
