"""Real local test hosts ("the sandbox"); only the GPU is simulated."""
